package command

import (
	"errors"
	"fmt"

	"github.com/dlock/dlock/internal/wire"
)

// TypePacked marks a log entry that carries several commands, packed into one
// entry by the leader's group commit so that replicating and storing them costs
// one entry's bookkeeping instead of one per request. It is not a Body: it only
// ever appears as the first byte of a whole entry, never inside one.
const TypePacked Type = 16

// packedVersion is the encoding version of a packed entry's frame.
const packedVersion = 1

// MaxPacked bounds the commands in one packed entry. Seq reserves 16 bits for
// a command's position in its entry.
const MaxPacked = 1024

// PackedOverhead is what the frame of a packed entry adds at most beyond its
// commands (type, version, count, and a length per command); the packer keeps
// a packed entry's commands plus this within MaxEntryBytes.
func PackedOverhead(n int) int { return 2 + 3 + 3*n }

// EncodePacked frames already encoded commands (each from Encode or
// EncodeChecked) as one log entry, in order.
func EncodePacked(cmds [][]byte) []byte {
	size := PackedOverhead(len(cmds))
	for _, c := range cmds {
		size += len(c)
	}
	w := &wire.Writer{Buf: make([]byte, 0, size)}
	w.Byte(byte(TypePacked))
	w.Byte(packedVersion)
	w.Uvarint(uint64(len(cmds)))
	for _, c := range cmds {
		w.Uvarint(uint64(len(c)))
		w.Fixed(c)
	}
	return w.Buf
}

// ErrPacked is returned for a malformed packed entry.
var ErrPacked = errors.New("malformed packed entry")

// DecodeEntry parses a command log entry: one command, or several packed into
// it (EncodePacked), in their order. packed says which; a packed entry of one
// command is still packed. It never panics on bad input.
func DecodeEntry(b []byte) (envs []*Envelope, packed bool, err error) {
	if len(b) == 0 || Type(b[0]) != TypePacked {
		e, err := Decode(b)
		if err != nil {
			return nil, false, err
		}
		return []*Envelope{e}, false, nil
	}
	r := wire.NewReader(b[1:])
	if v := r.Byte(); r.Err() == nil && (v == 0 || v > packedVersion) {
		return nil, true, fmt.Errorf("decode packed entry: version %d not supported by this build (upgrade this node)", v)
	}
	n := r.Count(2) // each command: a length and at least its type byte
	if err := r.Err(); err != nil {
		return nil, true, fmt.Errorf("decode packed entry: %w", err)
	}
	if n == 0 || n > MaxPacked {
		return nil, true, fmt.Errorf("decode packed entry: %d commands: %w", n, ErrPacked)
	}
	envs = make([]*Envelope, 0, n)
	for i := range n {
		size := r.Uvarint()
		if err := r.Err(); err != nil {
			return nil, true, fmt.Errorf("decode packed entry, command %d: %w", i, err)
		}
		if size == 0 || size > uint64(r.Len()) {
			return nil, true, fmt.Errorf("decode packed entry, command %d: length %d: %w", i, size, ErrPacked)
		}
		c := r.Raw(int(size))
		if Type(c[0]) == TypePacked {
			return nil, true, fmt.Errorf("decode packed entry, command %d: a packed entry inside another: %w", i, ErrPacked)
		}
		e, err := Decode(c)
		if err != nil {
			return nil, true, fmt.Errorf("decode packed entry, command %d: %w", i, err)
		}
		envs = append(envs, e)
	}
	if r.Len() != 0 {
		return nil, true, fmt.Errorf("decode packed entry: %d trailing bytes: %w", r.Len(), ErrPacked)
	}
	return envs, true, nil
}

// seqPosShift places a command's position within its packed entry above any
// log index a cluster can reach (2^48 entries is millennia at a million
// commits a second).
const seqPosShift = 48

// Seq names the command at position pos of the log entry at index: it is the
// index itself for a lone command and for the first of a packed entry (so a
// log written before packing keeps its meaning), and index + pos·2^48 for the
// others. Distinct commands get distinct Seqs; nothing orders them.
func Seq(index uint64, pos int) uint64 {
	return index + uint64(pos)<<seqPosShift
}
