package wire

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
)

// op writes one value and reads it back, reporting a mismatch.
type op struct {
	name  string
	write func(w *Writer)
	read  func(r *Reader) (got, want any)
}

func uv(v uint64) op {
	return op{"uvarint", func(w *Writer) { w.Uvarint(v) }, func(r *Reader) (any, any) { return r.Uvarint(), v }}
}

func sv(v int64) op {
	return op{"varint", func(w *Writer) { w.Varint(v) }, func(r *Reader) (any, any) { return r.Varint(), v }}
}

func str(s string) op {
	return op{"string", func(w *Writer) { w.String(s) }, func(r *Reader) (any, any) { return r.String(), s }}
}

func bl(b bool) op {
	return op{"bool", func(w *Writer) { w.Bool(b) }, func(r *Reader) (any, any) { return r.Bool(), b }}
}

func by(b byte) op {
	return op{"byte", func(w *Writer) { w.Byte(b) }, func(r *Reader) (any, any) { return r.Byte(), b }}
}

func fixed(b []byte) op {
	return op{"fixed", func(w *Writer) { w.Fixed(b) }, func(r *Reader) (any, any) {
		dst := make([]byte, len(b))
		r.Fixed(dst)
		return string(dst), string(b)
	}}
}

// count writes n as a collection length followed by n one-byte elements.
func count(n int) op {
	return op{"count", func(w *Writer) {
		w.Uvarint(uint64(n))
		w.Fixed(make([]byte, n))
	}, func(r *Reader) (any, any) {
		got := r.Count(1)
		r.Fixed(make([]byte, got))
		return got, n
	}}
}

func TestRoundTrip(t *testing.T) {
	long := strings.Repeat("z", MaxString)
	cases := []struct {
		name string
		ops  []op
		// enc, when set, is the exact encoding: the format is stored in the
		// Raft log and in snapshots, so it must not change.
		enc []byte
	}{
		{"uvarint 0", []op{uv(0)}, []byte{0x00}},
		{"uvarint 1", []op{uv(1)}, []byte{0x01}},
		{"uvarint 127", []op{uv(127)}, []byte{0x7f}},
		{"uvarint 128", []op{uv(128)}, []byte{0x80, 0x01}},
		{"uvarint 300", []op{uv(300)}, []byte{0xac, 0x02}},
		{"uvarint 2^63", []op{uv(1 << 63)}, []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}},
		{"uvarint max", []op{uv(math.MaxUint64)}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"uvarint boundaries", []op{uv(1<<7 - 1), uv(1 << 7), uv(1<<14 - 1), uv(1 << 14), uv(1<<56 - 1), uv(1 << 56), uv(math.MaxUint32)}, nil},
		{"varint 0", []op{sv(0)}, []byte{0x00}},
		{"varint -1", []op{sv(-1)}, []byte{0x01}},
		{"varint 1", []op{sv(1)}, []byte{0x02}},
		{"varint -64", []op{sv(-64)}, []byte{0x7f}},
		{"varint 64", []op{sv(64)}, []byte{0x80, 0x01}},
		{"varint max", []op{sv(math.MaxInt64)}, []byte{0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"varint min", []op{sv(math.MinInt64)}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"varint mixed", []op{sv(-2), sv(math.MinInt32), sv(math.MaxInt32), sv(-1 << 40), sv(math.MinInt64 + 1)}, nil},
		{"string empty", []op{str("")}, []byte{0x00}},
		{"string ab", []op{str("ab")}, []byte{0x02, 'a', 'b'}},
		{"string binary", []op{str("\x00\xff\x80")}, []byte{0x03, 0x00, 0xff, 0x80}},
		{"string 128 bytes", []op{str(strings.Repeat("q", 128))}, nil},
		{"string MaxString", []op{str(long)}, nil},
		{"bool", []op{bl(true), bl(false)}, []byte{0x01, 0x00}},
		{"byte", []op{by(0), by(0xff)}, []byte{0x00, 0xff}},
		{"fixed", []op{fixed([]byte{1, 2, 3}), fixed(nil), fixed([]byte{0})}, []byte{1, 2, 3, 0}},
		{"count 0", []op{count(0)}, []byte{0x00}},
		{"count fills the input", []op{count(3)}, []byte{0x03, 0, 0, 0}},
		{"mixed", []op{uv(7), str("name"), bl(true), sv(-300), fixed([]byte("0123456789abcdef")), str(""), by(9), count(2), uv(math.MaxUint64)}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var w Writer
			for _, o := range c.ops {
				o.write(&w)
			}
			if c.enc != nil && !bytes.Equal(w.Buf, c.enc) {
				t.Fatalf("encoded % x, want % x", w.Buf, c.enc)
			}
			r := NewReader(w.Buf)
			for i, o := range c.ops {
				if got, want := o.read(r); got != want {
					t.Fatalf("op %d (%s): read %v, wrote %v", i, o.name, got, want)
				}
			}
			if r.Err() != nil || r.Len() != 0 {
				t.Fatalf("err %v, %d bytes left", r.Err(), r.Len())
			}
		})
	}
}

// Every malformed input sets the sticky error, never panics, and from then on
// every read returns a zero value and consumes nothing.
func TestMalformed(t *testing.T) {
	overMax := append([]byte{0x81, 0x80, 0x40}, make([]byte, MaxString+1)...) // length MaxString+1, all present
	cases := []struct {
		name string
		in   []byte
		// read decodes up to the error; zero values are the reads that come after it.
		read func(r *Reader)
		// short: whether the error must be ErrShort (truncated input) or must
		// not be (bad but complete input).
		short bool
	}{
		{"empty uvarint", nil, func(r *Reader) { r.Uvarint() }, true},
		{"truncated uvarint", []byte{0x80}, func(r *Reader) { r.Uvarint() }, true},
		{"truncated long uvarint", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, func(r *Reader) { r.Uvarint() }, true},
		{"empty varint", nil, func(r *Reader) { r.Varint() }, true},
		{"truncated varint", []byte{0xff, 0x80}, func(r *Reader) { r.Varint() }, true},
		{"uvarint overflows 64 bits", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}, func(r *Reader) { r.Uvarint() }, false},
		{"uvarint of 11 bytes", []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, func(r *Reader) { r.Uvarint() }, false},
		{"varint overflows 64 bits", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}, func(r *Reader) { r.Varint() }, false},
		{"overlong uvarint 0", []byte{0x80, 0x00}, func(r *Reader) { r.Uvarint() }, false},
		{"overlong uvarint 1", []byte{0x81, 0x00}, func(r *Reader) { r.Uvarint() }, false},
		{"overlong uvarint of 3 bytes", []byte{0xff, 0x80, 0x00}, func(r *Reader) { r.Uvarint() }, false},
		{"overlong uvarint of 10 bytes", []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}, func(r *Reader) { r.Uvarint() }, false},
		{"overlong varint 0", []byte{0x80, 0x00}, func(r *Reader) { r.Varint() }, false},
		{"overlong varint -1", []byte{0x81, 0x00}, func(r *Reader) { r.Varint() }, false},
		{"overlong varint after a good one", []byte{0x02, 0x83, 0x80, 0x00}, func(r *Reader) {
			if v := r.Varint(); v != 1 {
				panic("first varint misread")
			}
			r.Varint()
		}, false},
		{"overlong string length", []byte{0x80, 0x00}, func(r *Reader) { _ = r.String() }, false},
		{"overlong count", []byte{0x80, 0x00, 0x00}, func(r *Reader) { r.Count(1) }, false},
		{"string length past the input", []byte{0x03, 'a', 'b'}, func(r *Reader) { _ = r.String() }, true},
		{"string length truncated", []byte{0x80}, func(r *Reader) { _ = r.String() }, true},
		{"string length huge", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 'a'}, func(r *Reader) { _ = r.String() }, true},
		{"string longer than MaxString", overMax, func(r *Reader) { _ = r.String() }, true},
		{"bool 2", []byte{0x02}, func(r *Reader) { r.Bool() }, false},
		{"bool 0xff", []byte{0xff}, func(r *Reader) { r.Bool() }, false},
		{"bool missing", nil, func(r *Reader) { r.Bool() }, true},
		{"byte missing", nil, func(r *Reader) { r.Byte() }, true},
		{"fixed short", []byte{1, 2, 3}, func(r *Reader) { r.Fixed(make([]byte, 4)) }, true},
		{"count exceeds input", []byte{0x04, 0, 0, 0}, func(r *Reader) { r.Count(1) }, true},
		{"count exceeds input by element size", []byte{0x02, 0, 0, 0}, func(r *Reader) { r.Count(2) }, true},
		{"count huge", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, func(r *Reader) { r.Count(0) }, true},
		{"count huge with a negative element size", []byte{0xff, 0xff, 0xff, 0xff, 0x0f, 0}, func(r *Reader) { r.Count(-5) }, true},
		{"count truncated", []byte{0x80}, func(r *Reader) { r.Count(1) }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("panic: %v", p)
				}
			}()
			r := NewReader(c.in)
			c.read(r)
			err := r.Err()
			if err == nil {
				t.Fatalf("no error for % x", c.in[:min(len(c.in), 16)])
			}
			if c.short != errors.Is(err, ErrShort) {
				t.Fatalf("errors.Is(%v, ErrShort) = %v, want %v", err, !c.short, c.short)
			}
			// The error sticks: later reads yield zero values, the same error, and
			// leave nothing to read.
			dst := []byte{7, 7}
			r.Fixed(dst)
			if r.Uvarint() != 0 || r.Varint() != 0 || r.String() != "" || r.Bool() || r.Byte() != 0 || r.Count(1) != 0 || dst[0] != 7 || dst[1] != 7 {
				t.Fatal("a read after the error returned a value")
			}
			if r.Err() != err {
				t.Fatalf("error changed from %v to %v", err, r.Err())
			}
			if r.Len() != 0 {
				t.Fatalf("%d bytes left to read after the error", r.Len())
			}
		})
	}
}

// Good values before a bad one read normally; the bad one stops the reader
// without consuming what follows it.
func TestStickyAfterGoodReads(t *testing.T) {
	var w Writer
	w.Uvarint(0)
	w.String("ok")
	w.Bool(true)
	in := append(w.Buf, 0x80, 0x00, 0x05)
	r := NewReader(in)
	if r.Uvarint() != 0 || r.String() != "ok" || !r.Bool() || r.Err() != nil {
		t.Fatalf("good prefix misread: %v", r.Err())
	}
	if r.Uvarint() != 0 || r.Err() == nil {
		t.Fatal("overlong varint after good values accepted")
	}
	if r.Uvarint() != 0 {
		t.Fatal("the byte after the bad varint was read")
	}
}

// Raw hands out the next bytes without a copy, and fails (sticky) past the end.
func TestRaw(t *testing.T) {
	in := []byte{1, 2, 3, 4}
	r := NewReader(in)
	a := r.Raw(3)
	if string(a) != "\x01\x02\x03" || r.Len() != 1 || r.Err() != nil {
		t.Fatalf("Raw(3) = %v, %d left, %v", a, r.Len(), r.Err())
	}
	if &a[0] != &in[0] {
		t.Fatal("Raw copied")
	}
	if cap(a) != 3 {
		t.Fatalf("Raw's slice has capacity %d: appending to it would overwrite the input", cap(a))
	}
	if b := r.Raw(2); b != nil || r.Err() == nil {
		t.Fatalf("Raw past the end = %v, %v", b, r.Err())
	}
	if b := r.Raw(1); b != nil {
		t.Fatal("Raw after an error returned bytes")
	}
	if b := NewReader(in).Raw(-1); b != nil {
		t.Fatal("Raw(-1) returned bytes")
	}
}
