package cache

// expiries is a min-heap of ledger entries by expiry: the ledger keeps
// one over all its ended keys, and one per tenant, so that it can find
// what has expired without looking at what has not. An entry records its
// place in each heap (entry.at), so that it leaves them in O(log n) when
// it is deleted or replaced. Live entries, which do not expire, are in
// no heap. The ledger's mutex guards the heaps.
type expiries struct {
	es []*entry
	// which of entry.at this heap keeps: 0 the ledger's, 1 the tenant's.
	which int
}

func (h *expiries) len() int { return len(h.es) }

// top returns the entry that expires first; the heap must not be empty.
func (h *expiries) top() *entry { return h.es[0] }

func (h *expiries) push(e *entry) {
	e.at[h.which] = int32(len(h.es))
	h.es = append(h.es, e)
	h.up(len(h.es) - 1)
}

// remove takes e out of the heap; e must be in it.
func (h *expiries) remove(e *entry) {
	i := int(e.at[h.which])
	last := len(h.es) - 1
	if i != last {
		h.swap(i, last)
	}
	h.es[last] = nil
	h.es = h.es[:last]
	e.at[h.which] = -1
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
	// Give back the room of a heap that shrank a lot, so a burst of
	// keys does not hold its memory for good.
	if c := cap(h.es); c > 1024 && len(h.es) < c/4 {
		h.es = append([]*entry(nil), h.es...)
	}
}

func (h *expiries) less(i, j int) bool { return h.es[i].expires.Before(h.es[j].expires) }

func (h *expiries) swap(i, j int) {
	h.es[i], h.es[j] = h.es[j], h.es[i]
	h.es[i].at[h.which] = int32(i)
	h.es[j].at[h.which] = int32(j)
}

func (h *expiries) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down sifts the entry at i down and reports whether it moved.
func (h *expiries) down(i int) bool {
	start, n := i, len(h.es)
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && h.less(r, c) {
			c = r
		}
		if !h.less(c, i) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > start
}
