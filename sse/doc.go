// Package sse owns the Server-Sent Events wire format as ssegate sees it.
//
// It reads events from an upstream LLM API (Scanner, in place and without
// allocating, held equal to go-sse's parser by a differential fuzz target;
// Read, a thin layer over go-sse's parser with a size bound, where events
// must be owned strings), writes events with proxy-assigned ids
// (AppendEvent, AppendComment), encodes and parses those ids (ID, ParseID),
// reads the few fields of a JSON request body the proxy acts on
// (ParseRequest), and decides from the events themselves, and from what the
// request asked for, whether a stream ended cleanly (Detector). Only a
// cleanly ended stream may be stored, so the Detector is deliberately
// strict: anything it does not recognise as a complete, error-free stream
// of a known dialect is reported as not clean, with a short reason for logs
// and metrics.
//
// The package imports nothing from the rest of ssegate; the Scanner and
// the writers are allocation-free so that the relay loop can reuse one
// buffer per stream.
package sse
