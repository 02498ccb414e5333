//go:build race

package cache

// raceEnabled: the race detector slows and jitters every memory access,
// so timing assertions only log under it.
const raceEnabled = true
