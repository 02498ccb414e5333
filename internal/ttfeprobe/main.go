package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"sort"
	"time"

	"github.com/valyala/fasthttp"
)

const body = `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Write a short story about a lighthouse keeper."}]}`

func main() {
	addr := os.Args[1]
	n := 3000
	// fasthttp HostClient
	hc := &fasthttp.HostClient{Addr: addr, StreamResponseBody: true}
	var ds []time.Duration
	for i := 0; i < n; i++ {
		req := fasthttp.AcquireRequest()
		req.SetRequestURI("http://" + addr + "/v1/chat/completions")
		req.Header.SetMethod("POST")
		req.Header.Set("X-Mock-Tokens", "7")
		req.SetBodyString(body)
		resp := fasthttp.AcquireResponse()
		t := time.Now()
		if err := hc.Do(req, resp); err != nil {
			panic(err)
		}
		br := bufio.NewReader(resp.BodyStream())
		var acc []byte
		for !bytes.Contains(acc, []byte("\n\n")) {
			b, _ := br.ReadByte()
			acc = append(acc, b)
		}
		ds = append(ds, time.Since(t))
		for {
			if _, err := br.ReadByte(); err != nil {
				break
			}
		}
		resp.CloseBodyStream()
		fasthttp.ReleaseResponse(resp)
		fasthttp.ReleaseRequest(req)
	}
	report("fasthttp HostClient", ds)
	// raw TCP
	conn, _ := net.Dial("tcp", addr)
	br := bufio.NewReader(conn)
	ds = ds[:0]
	reqb := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Mock-Tokens: 7\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	for i := 0; i < n; i++ {
		t := time.Now()
		conn.Write([]byte(reqb))
		first := true
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				panic(err)
			}
			if first && line == "\n" || first && line == "\r\n" && false {
			}
			if first && len(line) > 5 && line[:5] == "data:" {
				ds = append(ds, time.Since(t))
				first = false
			}
			if line == "0\r\n" {
				br.ReadString('\n')
				break
			}
		}
	}
	report("raw TCP", ds)
}

func report(name string, ds []time.Duration) {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	fmt.Printf("%-22s p50 %v p90 %v\n", name, ds[len(ds)/2], ds[len(ds)*9/10])
}
