// Package wire is the small binary codec shared by the Raft command encoding and
// the FSM snapshot format: varints, length-prefixed strings and fixed bytes, with a
// sticky error on the reader so decoders stay linear and never panic on bad input.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrShort is returned when the input ends before a value is complete.
var ErrShort = errors.New("wire: input truncated")

// MaxString bounds every length-prefixed field so a corrupt or hostile length
// cannot make the decoder allocate without limit.
const MaxString = 1 << 20

// Writer appends encoded values to a byte slice.
type Writer struct{ Buf []byte }

// Uvarint appends an unsigned varint.
func (w *Writer) Uvarint(v uint64) { w.Buf = binary.AppendUvarint(w.Buf, v) }

// Varint appends a signed (zig-zag) varint.
func (w *Writer) Varint(v int64) { w.Buf = binary.AppendVarint(w.Buf, v) }

// Byte appends one byte.
func (w *Writer) Byte(b byte) { w.Buf = append(w.Buf, b) }

// Bool appends a bool as one byte.
func (w *Writer) Bool(b bool) {
	if b {
		w.Byte(1)
	} else {
		w.Byte(0)
	}
}

// String appends a length-prefixed string.
func (w *Writer) String(s string) {
	w.Uvarint(uint64(len(s)))
	w.Buf = append(w.Buf, s...)
}

// Fixed appends raw bytes with no length prefix (the reader must know the size).
func (w *Writer) Fixed(b []byte) { w.Buf = append(w.Buf, b...) }

// Reader decodes values written by Writer. The first error sticks: later reads
// return zero values, and Err reports it.
type Reader struct {
	buf []byte
	err error
}

// NewReader reads from b.
func NewReader(b []byte) *Reader { return &Reader{buf: b} }

// Err is the first decoding error, if any.
func (r *Reader) Err() error { return r.err }

// Len is the number of unread bytes.
func (r *Reader) Len() int { return len(r.buf) }

func (r *Reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.buf = nil
}

// Uvarint reads an unsigned varint.
func (r *Reader) Uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.buf)
	if !r.varintRead(n) {
		return 0
	}
	if !r.minimal(n) {
		return 0
	}
	r.buf = r.buf[n:]
	return v
}

// varintRead checks the n that encoding/binary returned for a varint: 0 when
// the input ends inside it, negative when it overflows 64 bits.
func (r *Reader) varintRead(n int) bool {
	switch {
	case n == 0:
		r.fail(fmt.Errorf("wire: varint cut off: %w", ErrShort))
		return false
	case n < 0:
		r.fail(errors.New("wire: varint overflows 64 bits"))
		return false
	}
	return true
}

// minimal refuses a varint of n bytes that is longer than it needs to be
// (0x80 0x00 for 0): the writer never produces one, and accepting it would
// let two different byte strings decode to the same command, so that
// re-encoding a decoded entry would not give back its bytes. Only the single
// byte 0x00 may end in a zero byte.
func (r *Reader) minimal(n int) bool {
	if n > 1 && r.buf[n-1] == 0 {
		r.fail(fmt.Errorf("wire: varint of %d bytes is not in its shortest form", n))
		return false
	}
	return true
}

// Varint reads a signed varint.
func (r *Reader) Varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.buf)
	if !r.varintRead(n) {
		return 0
	}
	if !r.minimal(n) {
		return 0
	}
	r.buf = r.buf[n:]
	return v
}

// Byte reads one byte.
func (r *Reader) Byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.buf) < 1 {
		r.fail(ErrShort)
		return 0
	}
	b := r.buf[0]
	r.buf = r.buf[1:]
	return b
}

// Bool reads a bool; any byte other than 0 or 1 is an error.
func (r *Reader) Bool() bool {
	switch r.Byte() {
	case 0:
		return false
	case 1:
		return true
	default:
		r.fail(errors.New("wire: bad bool"))
		return false
	}
}

// String reads a length-prefixed string.
func (r *Reader) String() string {
	n := r.Uvarint()
	if r.err != nil {
		return ""
	}
	if n > MaxString || n > uint64(len(r.buf)) {
		r.fail(fmt.Errorf("wire: string of %d bytes: %w", n, ErrShort))
		return ""
	}
	s := string(r.buf[:n])
	r.buf = r.buf[n:]
	return s
}

// Fixed reads exactly len(dst) raw bytes into dst.
func (r *Reader) Fixed(dst []byte) {
	if r.err != nil {
		return
	}
	if len(r.buf) < len(dst) {
		r.fail(ErrShort)
		return
	}
	copy(dst, r.buf)
	r.buf = r.buf[len(dst):]
}

// Raw returns the next n bytes without copying: they alias the input.
func (r *Reader) Raw(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.buf) < n {
		r.fail(ErrShort)
		return nil
	}
	b := r.buf[:n:n]
	r.buf = r.buf[n:]
	return b
}

// Count reads a collection length and checks it against what the remaining input
// could possibly hold (each element takes at least minSize bytes).
func (r *Reader) Count(minSize int) int {
	n := r.Uvarint()
	if r.err != nil {
		return 0
	}
	if minSize < 1 {
		minSize = 1
	}
	if n > uint64(len(r.buf)/minSize) {
		r.fail(fmt.Errorf("wire: count %d exceeds input: %w", n, ErrShort))
		return 0
	}
	return int(n)
}
