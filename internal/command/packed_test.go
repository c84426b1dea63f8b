package command

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func packedCases() [][]byte {
	var cmds [][]byte
	for _, tc := range roundTripCases() {
		cmds = append(cmds, Encode(tc.env))
	}
	return cmds
}

// A packed entry gives back its commands, in order; a lone command decodes as
// before and is not packed; a packed entry of one command still is.
func TestPackedRoundTrip(t *testing.T) {
	cmds := packedCases()
	envs, packed, err := DecodeEntry(EncodePacked(cmds))
	if err != nil || !packed || len(envs) != len(cmds) {
		t.Fatalf("packed entry of %d commands: %d back, packed %v, %v", len(cmds), len(envs), packed, err)
	}
	for i, e := range envs {
		if !bytes.Equal(Encode(e), cmds[i]) {
			t.Fatalf("command %d came back as %x, want %x", i, Encode(e), cmds[i])
		}
	}
	envs, packed, err = DecodeEntry(cmds[0])
	if err != nil || packed || len(envs) != 1 || !bytes.Equal(Encode(envs[0]), cmds[0]) {
		t.Fatalf("a lone command: %d, packed %v, %v", len(envs), packed, err)
	}
	envs, packed, err = DecodeEntry(EncodePacked(cmds[:1]))
	if err != nil || !packed || len(envs) != 1 {
		t.Fatalf("a packed entry of one command: %d, packed %v, %v", len(envs), packed, err)
	}
	if len(EncodePacked(cmds)) > PackedOverhead(len(cmds))+len(bytes.Join(cmds, nil)) {
		t.Fatal("PackedOverhead understates the frame")
	}
}

// Malformed packed entries are errors, never panics or partial results.
func TestDecodeEntryRejectsMalformed(t *testing.T) {
	one := Encode(&Envelope{ClientID: "c", Body: &Tick{}})
	good := EncodePacked([][]byte{one, one})
	cases := map[string][]byte{
		"no version":          {byte(TypePacked)},
		"future version":      append([]byte{byte(TypePacked), packedVersion + 1}, good[2:]...),
		"version 0":           append([]byte{byte(TypePacked), 0}, good[2:]...),
		"no commands":         {byte(TypePacked), packedVersion, 0},
		"count beyond input":  {byte(TypePacked), packedVersion, 5, 1, byte(TypeTick)},
		"truncated":           good[:len(good)-1],
		"trailing bytes":      append(append([]byte(nil), good...), 0),
		"zero-length command": {byte(TypePacked), packedVersion, 1, 0, 0},
		"nested":              EncodePacked([][]byte{one, EncodePacked([][]byte{one})}),
		"bad command":         EncodePacked([][]byte{one, {byte(TypeAcquire), Version, 1}}),
		"unknown type inside": EncodePacked([][]byte{{200, 1}}),
	}
	for name, b := range cases {
		envs, packed, err := DecodeEntry(b)
		if err == nil || envs != nil {
			t.Errorf("%s: decoded %d commands, %v; want an error and nothing", name, len(envs), err)
		}
		if !packed {
			t.Errorf("%s: not reported as a packed entry", name)
		}
	}
	_, _, err := DecodeEntry(cases["nested"])
	if !errors.Is(err, ErrPacked) || !strings.Contains(err.Error(), "inside another") {
		t.Errorf("nested: %v", err)
	}
	tooMany := make([][]byte, MaxPacked+1)
	for i := range tooMany {
		tooMany[i] = one
	}
	if _, _, err := DecodeEntry(EncodePacked(tooMany)); !errors.Is(err, ErrPacked) {
		t.Errorf("%d commands in one entry: %v; want ErrPacked", len(tooMany), err)
	}
}

// Seq is the index for a lone command and the first of a packed entry, and
// distinct for every command of every entry.
func TestSeq(t *testing.T) {
	if Seq(42, 0) != 42 {
		t.Fatalf("Seq(42, 0) = %d", Seq(42, 0))
	}
	seen := map[uint64][2]uint64{}
	for _, index := range []uint64{1, 2, 3, 1 << 20, 1<<48 - 1} {
		for pos := range MaxPacked {
			s := Seq(index, pos)
			if prev, dup := seen[s]; dup {
				t.Fatalf("Seq(%d, %d) = Seq(%d, %d) = %d", index, pos, prev[0], prev[1], s)
			}
			seen[s] = [2]uint64{index, uint64(pos)}
		}
	}
}

func FuzzDecodeEntry(f *testing.F) {
	cmds := packedCases()
	f.Add(EncodePacked(cmds))
	f.Add(EncodePacked(cmds[:1]))
	f.Add(cmds[0])
	f.Add([]byte{byte(TypePacked), packedVersion, 2, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		envs, packed, err := DecodeEntry(b)
		if err != nil {
			if envs != nil {
				t.Fatalf("DecodeEntry returned commands and error %v", err)
			}
			return
		}
		if len(envs) == 0 || len(envs) > MaxPacked || (!packed && len(envs) != 1) {
			t.Fatalf("%d commands, packed %v", len(envs), packed)
		}
		// Re-packing what decoded decodes to the same commands.
		re := make([][]byte, len(envs))
		for i, e := range envs {
			re[i] = Encode(e)
		}
		again, _, err := DecodeEntry(EncodePacked(re))
		if err != nil || len(again) != len(envs) {
			t.Fatalf("re-packed entry: %d commands, %v", len(again), err)
		}
		for i := range envs {
			if !sameEnvelope(envs[i], again[i]) {
				t.Fatalf("command %d differs after re-packing", i)
			}
		}
	})
}
