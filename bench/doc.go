// Command bench is ssegate's end-to-end benchmark suite: it measures the
// ssegate binary against the upstream direct and against the relays a user
// would otherwise pick, side by side in one run.
//
//	go run ./bench [-scenarios a,b,c,d,e,f,sweep,redis,shard,board] [-peers httputil,fasthttp,nginx,caddy,portkey,ssegate] [-rounds 3] [-duration 5s] [-quick] [-out DIR] [-baseline BIN] [-traces] [-profile DIR]
//	make bench                      # the whole suite
//	go run ./bench -scenarios board [-board-conc 1,64] [-board-paced 500] [-board-deltas 64] [-board-pace 20ms]  # the gateway board (Board below)
//	go run ./bench -scenarios shard -peers ssegate [-shard-steps 10000,25000,50000,100000] [-shard-server redis|valkey] [-shard-io-threads 1]  # streams one Redis shard holds (Shard below)
//	make bench BENCHFLAGS=-quick    # a smoke run, well under a minute
//	make bench BENCHFLAGS='-baseline /path/to/old-ssegate -scenarios a,b'  # ssegate beside an older build (Baseline below)
//	go run ./bench -profile /tmp/prof -scenarios a  # ssegate's CPU and heap profiles (Profiles below)
//	go run ./bench -soak [-soak-streams 10000] [-soak-duration 10m]
//	make soak                       # the soak (soak.go): lost and reordered events, goroutines and memory over time
//
// # Peers
//
// The upstream is the embedded mock LLM (internal/mockllm) in a child process,
// streaming OpenAI chat chunks of about 240 bytes; each request sets its
// length and pace with X-Mock-Tokens and X-Mock-Delay. Every path reaches it:
//
//   - direct: the clients talk to the mock itself (the limit);
//   - httputil: httputil.ReverseProxy with FlushInterval -1, a child process
//     of this binary, reading each request body into memory first (without
//     that it cuts a few percent of streams: see serveHTTPUtil);
//   - fasthttp: the smallest relay on ssegate's own libraries (a fasthttp
//     server and HostClient, the body copied with SetBodyStreamWriter and
//     a flush per upstream read), a child process of this binary: it
//     parses and records nothing, so it shows what fasthttp and the Go
//     runtime cost on this machine before ssegate does anything;
//   - nginx: proxy_buffering off, upstream keep-alive, when nginx is on PATH
//     (a generated configuration in a temporary prefix, in the foreground,
//     stopped after each measurement);
//   - caddy: Caddy's reverse_proxy with flush_interval -1, keep-alive to
//     the upstream (up to 1024 idle connections), the admin endpoint off,
//     automatic HTTPS off, no access log, errors only in its log: a
//     generated JSON configuration (caddy.go) in a temporary directory,
//     started with caddy run per measurement. It is built at the start
//     with go build -C bench/caddy, a module of its own (the current
//     release, v2.11.9, with only the reverse proxy), so that ssegate's
//     go.mod does not carry Caddy's dependencies; the Go module proxy
//     serves them on the first build, which takes a few minutes on two
//     cores (later ones come from the build cache). A distribution's
//     caddy is not used: Debian's 2.6.2 truncates streams under load;
//   - portkey: the Portkey gateway (@portkey-ai/gateway 1.15.2, Node),
//     when node and npm are on PATH (skipped with a note otherwise). It
//     is installed with npm ci from bench/portkey (package.json and its
//     package-lock.json) into the user's cache directory, once per
//     content of those files, over the npm registry on the first run. A
//     plain npm install of the gateway answers 500 to every stream: the
//     newest @hono/node-server makes response headers immutable, which
//     the gateway's ResponseService trips on (Portkey-AI/gateway#1389);
//     the lockfile pins @hono/node-server at 1.13.5, the version of the
//     gateway's own patches/@hono+node-server+1.13.5.patch (its
//     lockfile's pin), and resolves the rest as of the gateway's release
//     (npm install --before 2026-08-23). The gateway's requests carry
//     its routing headers, which the load generator adds for this peer
//     alone: x-portkey-provider: openai, x-portkey-custom-host:
//     http://<mock>/v1, and x-portkey-forward-headers: x-mock-tokens,
//     x-mock-delay, without which it would not pass the mock's length
//     and pace on. It listens on every interface and has no option for
//     the host; bench/portkey/loopback.cjs, preloaded with node -r, binds
//     it to 127.0.0.1. It is slow (about 0.05× direct saturated, and at
//     hundreds of paced streams it cannot keep the pace): its rows say
//     what it did, streams not whole counted as errors as for any peer;
//   - ssegate, without Idempotency-Key, and ssegate+key with a unique key
//     per stream (the recording path), built from ./cmd/ssegate at the start
//     (or -ssegate BIN);
//   - with -baseline BIN, ssegate@baseline and ssegate@baseline+key: the
//     same two paths through a second ssegate binary (Baseline below).
//
// -peers picks the peers beside direct; by default all of them (httputil,
// fasthttp, nginx, caddy, portkey, ssegate), less those that cannot run
// here, each with a note in the report. Each peer starts in a process
// group of its own, on loopback, and is stopped after the measurement.
//
// Each measurement starts a fresh peer process, so that its idle RSS, CPU
// time and peak RSS (VmHWM) belong to that measurement; the CPU is
// utime+stime of /proc/<pid>/stat, summed with the process's descendants
// (nginx's workers, whatever Node spawns). The report's header names the
// versions of nginx, caddy and the Portkey gateway, and a summary at its
// top puts ssegate and ssegate+key beside caddy and nginx in every step
// where they ran (a, b, c, e and sweep): the scenario's main metric and
// CPU per event of both, and the medians of their per-round ratios. The paths are interleaved, every path once a round,
// and the tables show medians over rounds, with ratios to direct computed
// within each round.
//
// # Baseline
//
// To show in one run what a change costs, -baseline measures a second
// ssegate binary, e.g. one built from the commit before the change, beside
// the one under test:
//
//	git worktree add /tmp/old HEAD~1
//	(cd /tmp/old && CGO_ENABLED=0 go build -trimpath -o /tmp/old-ssegate ./cmd/ssegate)
//	go run ./bench -baseline /tmp/old-ssegate -scenarios a,b
//
// Its paths, ssegate@baseline and ssegate@baseline+key, start the baseline
// binary with the same flags and environment as ssegate (the suite's,
// -ssegate-args and -ssegate-env) and make the same requests as ssegate and
// ssegate+key. They are measured in every round of every scenario that
// measures those two (a, b, c, e and sweep; d, f and redis have ssegate
// paths of their own and no baseline), each right after its ssegate
// counterpart, so that drift of the machine hits the pair alike. Their
// rows are in those tables, in the JSON (server "baseline"; the report
// names the binary and, when they were built in a checkout, the VCS
// revision of both binaries) and in the sweep chart; a summary at the top
// of the report puts every ssegate row beside its baseline's: the
// scenario's main metric and proxy CPU per event of both, and the medians
// of their per-round ratios. It needs ssegate in -peers. Without -baseline
// the run is as before.
//
// # Traces
//
// With -traces the measured ssegate exports its spans (-traces otlp) over
// OTLP/HTTP to a sink in the bench process, which reads and counts them
// (a note of the report says how many); ssegate@baseline does not. With
// the same binary as -baseline, the summary is what tracing costs:
//
//	go build -o /tmp/ssegate ./cmd/ssegate
//	go run ./bench -ssegate /tmp/ssegate -baseline /tmp/ssegate -traces -scenarios a,b
//
// Without -traces, and a baseline built before the spans, it shows what
// they cost while off.
//
// # Profiles
//
// With -profile DIR, every measurement of ssegate (and of the -baseline
// binary) starts it with -pprof on an admin listener of its own
// (-admin-listen), so that its profiler answers beside the load. During
// the load the suite fetches /debug/pprof/profile?seconds=N, N being
// -duration rounded up to whole seconds (at least 1: in the scenarios
// that are not timed, such as c, the profile covers the first N seconds),
// and after it /debug/pprof/heap; it writes them to
// DIR/SCENARIO-STEP-rROUND-PATH.cpu.pprof and .heap.pprof (the step is
// left out where a scenario has none; each run of characters such as
// spaces, '+' and '@' becomes one '_'), e.g.
// a-64_streams_200_events-r1-ssegate_key.cpu.pprof:
//
//	go run ./bench -profile /tmp/prof -scenarios a -rounds 1 -peers ssegate
//	go tool pprof -top /tmp/prof/a-64_streams_200_events-r1-ssegate_key.cpu.pprof
//
// Profiling costs ssegate a little CPU (the profiler's signals at 100 Hz),
// which its CPU column includes; the other peers run as without it. A
// profile that cannot be fetched is noted on stderr and the measurement
// stands.
//
// # Load
//
// The load generator is a minimal HTTP/1.1 client on raw connections
// (chunked decoding, keep-alive) that counts SSE events as they arrive, so
// that it costs the shared CPU little. Every stream is checked whole: status
// 200, the expected number of events, data: [DONE] last, no error event;
// anything else is an error, and every table has an error column.
//
// # Scenarios
//
//   - a, saturation: -conc streams of -events events back to back, no pacing;
//   - b, latency: one stream of 10 events at a time; time to first event
//     and what each path adds to direct's;
//   - c, many slow streams: for every -slow step, N streams opened at once
//     and paced by the upstream; proxy CPU per event and RSS per live stream;
//   - d, replay: cache hits of one stored stream against direct generations;
//   - e, fan-out: groups of -conc clients sending the same keyed request at
//     once (one generation each group), with the upstream calls counted;
//   - f, resume: reconnects with Last-Event-ID (GET /streams/{key} and a
//     repeated POST) into a stored stream, against fresh streams of the same
//     remaining length;
//   - sweep: saturation at each -sweep concurrency, for the SVG chart.
//   - redis: ssegate's Redis store (-redis) on a private redis-server, when
//     redis-server is on PATH (skipped with a note otherwise), beside the
//     in-memory store: CPU per event (ssegate's and redis-server's, apart
//     and summed, with redis-server's idle CPU over the step beside it) and
//     Redis round trips per event at the -redis-load step;
//     the latency a joiner on another replica adds to each event over the
//     first client's (p50/p99) and its wait for its first event at the
//     -redis-join step (one follower per stream on another replica, so
//     those journals are mirrored), beside a joiner on the owner replica
//     and one on a single in-memory replica; round trips are counted by
//     redis-server (INFO commandstats) per event produced.
//   - shard: how many concurrent streams one Redis shard holds, the Redis
//     store driven without HTTP (Shard below).
//   - board: the method of the independent LLM-gateway board (Board below).
//
// # Shard
//
// Scenario shard drives package cache/redis's store itself (redis.New),
// not ssegate: the store's work per stream is what is measured, and the
// events need not cross HTTP. Each -shard-steps step keeps N streams live
// at once against a fresh private redis-server (or valkey-server with
// -shard-server valkey, with -shard-io-threads): each stream slot claims a
// new key, appends -shard-events events evenly over -shard-stream (10 s
// of 200 events by default, an LLM's pace), has its lease renewed, and
// commits, then starts the next; a -shard-follow share (5 %) of the slots
// is followed by a second store instance (another replica), which joins
// after the first event, asks the owner for the mirror and reads it to the
// committed end. The slots start spread over one stream's length (the
// ramp); then a steady window of -shard-window is measured: the server's
// CPU from /proc as a share of one core (the process, and its main thread
// apart), INFO commandstats and INFO stats (reads of client sockets: round
// trips) per stream committed in the window, claim and commit latency
// p50/p99 and the followers' join wait (of those begun in the window),
// the stores' counters, and the drivers' own CPU and pace lag; beside it
// an idle server, started with the measured one and read over the same
// window, whose CPU (the cron) is subtracted, and the server's time by
// command per stream. A step with
// errors fails and stops the scenario, as does the knee: server CPU above
// -shard-knee-cpu (90 % of a core) or claim or commit p99 above
// -shard-knee-p99 (50 ms). The streams are driven by child processes of
// the bench binary, one per -shard-per-proc streams (25,000) unless
// -shard-procs says, each stepping all its streams from one timing wheel
// (2 ms ticks); an unfollowed stream's events, which Redis sees only as
// counts in the renewals and as the result in the commit, are appended in
// chunks of those due every -shard-local-chunk (1 s). A driver whose CPU
// nears a core, or whose lag grows, means the step needs more of them
// (the table shows both); -shard-profile DIR writes each driver's CPU
// profile. -shard-tail-batch sets the following store's
// -redis-tail-batch. -shard-replica gives the step's server a replica;
// -shard-wait-replicas N sets the stores' -redis-wait-replicas (and gives
// the server its replica); -shard-failover kills the primary mid-window,
// promotes the replica, and claims every key again after the run: a
// committed key that does not replay would be paid for twice.
// -quick runs steps of 200 and 500 streams of 40 events over 2 s.
//
// # Board
//
// Scenario board measures what each path adds to the direct path's latency
// and time to first token, the way the independent LLM-gateway board
// (GetBusbar's) does: the mock upstream, one request at a time and 64 at
// once (-board-conc), and three kinds of request, every answer of
// -board-deltas (64) content tokens: non-streaming ("stream": false),
// dense streams (the deltas back to back) and paced streams (the deltas
// -board-pace, 20 ms, apart). Its paths are direct, nginx, fasthttp (the
// bare relay), caddy, ssegate without a key, ssegate+key (a fresh key a
// request) and ssegate hit (the key of one answer stored before the load,
// a replay), and with -baseline the baseline's two paths, interleaved in
// rounds. Latency runs from writing the request to the end of the answer;
// time to first token (TTFT) to the end of the first event that carries
// generated text (a chat chunk whose delta content is not empty: the
// mock's first chunk, which names the role with "content":"", is not one).
// A path's samples are pooled over the rounds and added p50, p99 and p99.9
// are its percentiles minus direct's over the same rounds (shown once the
// samples reach them: 100 for p99, 1,000 for p99.9); CPU per request is
// the peer process's utime+stime per request made, the median over
// rounds. The table gives the count of samples of every row, and cites the
// published board's own figures beside it as another rig's. A summary at
// the top of the report reads the keyed path's targets off the same rows,
// each as ssegate's figure, what it is held against, their ratio and
// difference, and whether it is met: a fresh key's added latency p50 and
// added TTFT p50 within 10 µs of the path without a key, its added p99
// (latency and TTFT) no worse than the bare relay's, the path without a
// key adding no more at p50 than the bare relay, and CPU per keyed request
// at most 1.2× the bare relay's.
//
// The timed kinds (non-streaming, dense) run -duration a round; the paced
// streams are counted instead: -board-paced (500, enough for a p99) a path
// at each concurrency over all rounds, each round its share rounded up to
// as many for every client (192 a round at 64). At concurrency 1 a paced stream takes (deltas+3) × pace,
// 1.34 s, so the default 500 take 11 minutes a path, and the scenario
// about 80 minutes with every peer (it logs its estimate at the start);
// -board-paced 100 gives a rough look in under half an hour (its p99 is
// the 99th of 100 samples), and -quick makes 4 streams paced 5 ms apart.
//
// # Output
//
// The Markdown tables go to stdout and, with the JSON of every measurement
// of every round and the SVG chart, to bench/results/ (or -out). Progress
// goes to stderr; the peers' logs to a logs-* directory beside the results.
package main
