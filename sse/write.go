package sse

import "strings"

// AppendEvent appends the wire form of one event to dst: "id: <id>\n"
// (omitted when id.IsZero()), "event: <typ>\n" (omitted when typ == ""), one
// "data: <line>\n" per line of data, then the blank line that dispatches it.
//
// Lines of data are split at "\n", "\r\n" and "\r", because SSE readers
// treat all three as line breaks: a lone "\r" copied verbatim would end the
// field early and could inject fields. So data read back is data with "\r\n"
// and "\r" turned into "\n". A line break in typ is replaced by a space, for
// the same reason. AppendEvent does not allocate when dst has room.
func AppendEvent(dst []byte, id ID, typ, data string) []byte {
	dst = appendHead(dst, id, typ)
	if strings.IndexByte(data, '\r') < 0 {
		// Fast path for the usual payload: IndexByte is vectorised,
		// IndexAny is not.
		for {
			i := strings.IndexByte(data, '\n')
			if i < 0 {
				break
			}
			dst = appendData(dst, data[:i])
			data = data[i+1:]
		}
		dst = appendData(dst, data)
		return append(dst, '\n')
	}
	for {
		i := strings.IndexAny(data, "\r\n")
		if i < 0 {
			break
		}
		dst = appendData(dst, data[:i])
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	dst = appendData(dst, data)
	return append(dst, '\n')
}

// AppendLineEvent is AppendEvent for data that holds no "\r" or "\n"
// (Scanner.OneLine): it is written as one data line, without a search for
// line breaks. Data with one would be written as it is, where it would
// end the field: only data known to hold none may be given.
func AppendLineEvent(dst []byte, id ID, typ, data string) []byte {
	dst = appendData(appendHead(dst, id, typ), data)
	return append(dst, '\n')
}

// appendHead appends an event's id and event lines (AppendEvent).
func appendHead(dst []byte, id ID, typ string) []byte {
	if !id.IsZero() {
		dst = append(dst, "id: "...)
		dst = id.Append(dst)
		dst = append(dst, '\n')
	}
	if typ != "" {
		dst = append(dst, "event: "...)
		dst = appendOneLine(dst, typ)
		dst = append(dst, '\n')
	}
	return dst
}

// AppendComment appends ": <text>\n\n", a comment line that readers ignore
// (the proxy's keep-alive). A line break in text is replaced by a space so
// that the text cannot end the comment and start a field.
func AppendComment(dst []byte, text string) []byte {
	dst = append(dst, ": "...)
	dst = appendOneLine(dst, text)
	return append(dst, "\n\n"...)
}

func appendData(dst []byte, line string) []byte {
	dst = append(dst, "data: "...)
	dst = append(dst, line...)
	return append(dst, '\n')
}

// appendOneLine appends s with every '\r' and '\n' replaced by a space.
func appendOneLine(dst []byte, s string) []byte {
	for {
		i := strings.IndexAny(s, "\r\n")
		if i < 0 {
			return append(dst, s...)
		}
		dst = append(dst, s[:i]...)
		dst = append(dst, ' ')
		s = s[i+1:]
	}
}
