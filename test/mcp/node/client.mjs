// The MCP TypeScript SDK's client, driven by test/mcp (node_test.go):
//
//   node client.mjs '[{"scenario": ..., "url": ..., "runs": ..., "auth": ..., ...}, ...]'
//
// runs each scenario in turn through ssegate at its url and prints their
// outcomes as one JSON array; the Go test counts the tool's runs on the
// server. (One process for them all: loading the SDK takes a while.) A
// cut is a fetch aborted under the SDK, as a network that drops the
// connection.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const META_KEY = "ssegate/idempotency-key";
const plan = JSON.parse(process.argv[2]);
let opts; // the scenario's, while it runs

// connect opens a client session through ssegate. With headerKey, the
// key goes as Idempotency-Key on its tools/call POSTs.
async function connect(headerKey) {
  const inflight = new Set();
  const cuttable = async (url, init = {}) => {
    const ac = new AbortController();
    inflight.add(ac);
    const headers = new Headers(init.headers);
    headers.set("Authorization", opts.auth);
    if (headerKey && typeof init.body === "string" && JSON.parse(init.body).method === "tools/call") {
      headers.set("Idempotency-Key", headerKey);
    }
    // The controller stays in the set while the body may still be read.
    return fetch(url, { ...init, headers, signal: ac.signal });
  };
  const transport = new StreamableHTTPClientTransport(new URL(opts.url + "/mcp"), {
    fetch: cuttable,
    reconnectionOptions: { maxRetries: 0, initialReconnectionDelay: 100, maxReconnectionDelay: 100, reconnectionDelayGrowFactor: 1 },
  });
  const client = new Client({ name: "ssegate-test-ts", version: "1" });
  client.onerror = () => {}; // a cut is the point of some scenarios
  transport.onerror = () => {};
  await client.connect(transport);
  client.cut = () => {
    for (const ac of inflight) ac.abort();
  };
  return client;
}

// call calls a tool and returns its text, isError and the progress it got,
// or the error it ended in.
async function call(client, name, args, key, timeout = 30000) {
  const params = { name, arguments: args };
  if (key) params._meta = { [META_KEY]: key };
  let progress = 0;
  try {
    const r = await client.callTool(params, undefined, { onprogress: () => progress++, timeout });
    return { text: r.content.map((c) => c.text).join(""), isError: !!r.isError, progress };
  } catch (e) {
    return { error: String(e.message || e), progress };
  }
}

async function runs(target) {
  const r = await fetch(`${opts.runs}?target=${encodeURIComponent(target)}`);
  return Number(await r.text());
}

async function waitRuns(target, n) {
  const deadline = Date.now() + 10000;
  while ((await runs(target)) < n) {
    if (Date.now() > deadline) throw new Error(`${target} did not run`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const scenarios = {
  // A call cut mid-run, re-issued by a new session with a new id (after
  // a tools/list) and the same key; then re-issued once more after its end.
  async reissue() {
    const headerKey = opts.carrier === "header" ? opts.key : "";
    const metaKey = opts.carrier === "meta" ? opts.key : "";
    const a = await connect(headerKey);
    call(a, "write", { target: opts.target }, metaKey); // never settles: its connection is cut
    await waitRuns(opts.target, 1);
    a.cut();
    const b = await connect(headerKey);
    const tools = (await b.listTools()).tools.map((t) => t.name);
    const reissue = await call(b, "write", { target: opts.target }, metaKey);
    const c = await connect(headerKey);
    const after = await call(c, "write", { target: opts.target }, metaKey);
    return { tools, reissue, after };
  },
  // 16 re-issues at once on one session, each with its own id and
  // progress token.
  async concurrent() {
    const c = await connect("");
    const calls = [];
    for (let i = 0; i < 16; i++) calls.push(call(c, "write", { target: opts.target }, opts.key));
    return { calls: await Promise.all(calls) };
  },
  // Two keyless calls with the same arguments at once, from two sessions.
  async keyless() {
    const [a, b] = await Promise.all([connect(""), connect("")]);
    const calls = await Promise.all([a, b].map((c) => call(c, "write", { target: opts.target, ms: opts.ms }, "")));
    return { calls };
  },
  // A keyed call whose server dies mid-run, then its re-issue.
  async dies() {
    const out = [];
    for (let i = 0; i < 2; i++) {
      const c = await connect("");
      // A client left without an answer gives up after 8 s, not 30.
      out.push(await call(c, "write", { target: opts.target, die: true }, opts.key, 8000));
    }
    return { calls: out };
  },
};

try {
  const outs = [];
  for (opts of plan) outs.push(await scenarios[opts.scenario]());
  process.stdout.write(JSON.stringify(outs) + "\n");
  process.exit(0);
} catch (e) {
  process.stdout.write(JSON.stringify({ fatal: String(e.stack || e) }) + "\n");
  process.exit(1);
}
