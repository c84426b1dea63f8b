package chaos

// Storage faults: damage to a stopped node's files (a flipped byte in its
// newest log segment or snapshot, a log segment cut short) and a full disk
// (the node's data dir on a small tmpfs, filled by a ballast file). A damaged
// node must either refuse to start with "refusing data dir" — then the
// nemesis recovers it as docs/operations.md tells an operator to: remove the
// member, wipe the data dir, join again — or start with nothing wrong (the
// damage hit bytes no entry uses); the run's usual checks then prove that
// nothing it applied or voted on was corrupted. A node whose disk fills stops
// on its failed write, a leader below its free-space reserve refuses writes
// (503 disk_full, which the clients retry), and both carry on once the
// ballast is gone.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/dlock/dlock/internal/proc"
)

// Storage fault kinds.
const (
	fCorruptLog      = "corrupt-log"      // flip a byte near the end of a stopped follower's newest WAL segment
	fTruncateLog     = "truncate-log"     // cut a stopped follower's newest WAL segment short
	fCorruptSnapshot = "corrupt-snapshot" // flip a byte of a stopped follower's newest snapshot
	fDiskLow         = "disk-low"         // leave a node's disk below the free-space reserve
	fDiskFull        = "disk-full"        // fill a node's disk completely
)

// diskSize is each node's tmpfs when the disk faults run; lowFree is what
// disk-low leaves, below dlock serve's default 64 MiB reserve.
const (
	diskSize = 1 << 30 // room for the WAL segments both engines allocate ahead, and snapshots
	lowFree  = 16 << 20
)

// mountDisks puts each node's data dir on a tmpfs of its own, so that the
// disk faults fill one node's file system and nothing else. It needs root
// and a mount namespace that allows it; without them the disk faults are
// left out (and the run says so).
func (c *cluster) mountDisks() error {
	if os.Getenv("DLOCK_CHAOS_DISK_FAULTS") == "0" {
		return errors.New("DLOCK_CHAOS_DISK_FAULTS=0")
	}
	if os.Geteuid() != 0 {
		return errors.New("not root: cannot mount a tmpfs per node")
	}
	for _, nd := range c.nodes {
		mnt := filepath.Join(c.dir, nd.id+"-disk")
		if err := os.MkdirAll(mnt, 0o755); err != nil {
			return err
		}
		out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", diskSize), "tmpfs", mnt).CombinedOutput()
		if err != nil {
			c.unmountDisks()
			return fmt.Errorf("mount a tmpfs on %s: %v: %s", mnt, err, bytes.TrimSpace(out))
		}
		nd.disk = mnt
		nd.dataDir = filepath.Join(mnt, "data")
	}
	return nil
}

// unmountDisks undoes mountDisks (after the nodes are stopped).
func (c *cluster) unmountDisks() {
	for _, nd := range c.nodes {
		if nd.disk != "" {
			_ = exec.Command("umount", "-l", nd.disk).Run()
			nd.disk = ""
		}
	}
}

// fill writes a ballast file on node i's disk so that about leave bytes stay
// free (0: none).
func (c *cluster) fill(i int, leave int64) error {
	nd := c.nodes[i]
	var st syscall.Statfs_t
	if err := syscall.Statfs(nd.disk, &st); err != nil {
		return err
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	n := free - leave
	if n <= 0 {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(nd.disk, "ballast"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := f.Write(buf[:k]); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return nil // full: what disk-full wants
			}
			return err
		}
		n -= k
	}
	return nil
}

// unfill removes node i's ballast.
func (c *cluster) unfill(i int) error {
	err := os.Remove(filepath.Join(c.nodes[i].disk, "ballast"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// damage changes a stopped node's files as kind says, with offsets drawn
// from pick, and describes what it did.
func (c *cluster) damage(i int, kind string, pick int) (string, error) {
	nd := c.nodes[i]
	if kind == fCorruptSnapshot {
		snaps, _ := filepath.Glob(filepath.Join(nd.dataDir, "snapshots", "*", "state.bin"))
		if len(snaps) == 0 {
			// The etcd engine: one file per snapshot beside its log store.
			snaps, _ = filepath.Glob(filepath.Join(nd.dataDir, "raftlog", "snap", "*.snap"))
		}
		if len(snaps) > 0 {
			sort.Strings(snaps) // names start with the term and index (etcd: group, term, index): the last is the newest
			return flipByte(snaps[len(snaps)-1], 0, pick)
		}
		kind = fCorruptLog // no snapshot yet: damage the log instead
	}
	segs, _ := filepath.Glob(filepath.Join(nd.dataDir, "wal", "*.wal"))
	if len(segs) == 0 {
		// The etcd engine: pebble's write-ahead logs (allocated ahead, zero-filled, like raft-wal's segments).
		segs, _ = filepath.Glob(filepath.Join(nd.dataDir, "raftlog", "*.log"))
	}
	if len(segs) == 0 {
		return "no wal segment (bolt log store?): nothing damaged", nil
	}
	sort.Strings(segs) // names start with the base index
	seg := segs[len(segs)-1]
	end, err := writtenEnd(seg)
	if err != nil {
		return "", err
	}
	// Within the last 32 KiB written: the entries after the newest snapshot.
	lo := max(int64(64), end-32<<10)
	if end <= lo {
		return fmt.Sprintf("%s holds %d bytes: nothing damaged", filepath.Base(seg), end), nil
	}
	if kind == fTruncateLog {
		at := lo + int64(pick)%(end-lo)
		if err := os.Truncate(seg, at); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s cut from %d to %d bytes", filepath.Base(seg), end, at), nil
	}
	return flipByte(seg, lo, pick)
}

// flipByte inverts one byte of file at an offset in [from, written end).
func flipByte(file string, from int64, pick int) (string, error) {
	end, err := writtenEnd(file)
	if err != nil {
		return "", err
	}
	if end <= from {
		return fmt.Sprintf("%s holds %d bytes: nothing damaged", filepath.Base(file), end), nil
	}
	at := from + int64(pick)%(end-from)
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, at); err != nil {
		return "", err
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, at); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s byte %d of %d flipped", filepath.Base(file), at, end), f.Sync()
}

// writtenEnd is where a file's data ends: raft-wal preallocates its segments,
// so the size says nothing; the last non-zero byte does.
func writtenEnd(file string) (int64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	end := len(b)
	for end > 0 && b[end-1] == 0 {
		end--
	}
	return int64(end), nil
}

// startOrReplace starts node i after its files were damaged. If it refuses
// its data dir, it is replaced as an operator would: removed from the
// cluster through another node, wiped, and started again to join as a new
// member. It says which happened.
func (c *cluster) startOrReplace(i int) (string, error) {
	if err := c.start(i); err != nil {
		return "", err
	}
	nd := c.nodes[i]
	if !nd.p.WaitExit(5 * time.Second) {
		return "started", nil
	}
	tail := proc.LogTail(nd.logPath, 20)
	if !strings.Contains(tail, "refusing data dir") {
		return "", fmt.Errorf("%s exited after damage without refusing its data dir: %s", nd.id, tail)
	}
	var err error
	for try := 0; try < 20; try++ {
		via := (i + 1 + try) % len(c.nodes)
		if via == i {
			continue
		}
		if err = c.removeMember(via, i); err == nil || c.removedFromCluster(i) {
			err = nil
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		return "refused", fmt.Errorf("remove %s after it refused its data dir: %w", nd.id, err)
	}
	if err := c.wipe(i); err != nil {
		return "refused", err
	}
	return "refused, replaced", c.start(i)
}

// injectStorage injects one storage fault of kind on node t and returns its
// description and heal.
func (n *nemesis) injectStorage(kind string, t, pick int) (string, func() error, error) {
	c := n.c
	switch kind {
	case fCorruptLog, fTruncateLog, fCorruptSnapshot:
		if err := c.kill(t); err != nil {
			return "", nil, err
		}
		what, err := c.damage(t, kind, pick)
		heal := func() error {
			outcome, err := c.startOrReplace(t)
			n.note(kind, outcome)
			return err
		}
		return what, heal, err
	case fDiskLow, fDiskFull:
		leave := int64(lowFree)
		if kind == fDiskFull {
			leave = 0
		}
		err := c.fill(t, leave)
		heal := func() error {
			if err := c.unfill(t); err != nil {
				return err
			}
			if !c.running(t) {
				// It stopped on a failed write, as it must: start it again.
				n.note(kind, "node stopped on a failed write")
				return c.start(t)
			}
			n.note(kind, "node kept running")
			return nil
		}
		return fmt.Sprintf("%d bytes left free", leave), heal, err
	}
	return "", nil, fmt.Errorf("unknown storage fault %q", kind)
}

// note counts how a storage fault ended, for the report.
func (n *nemesis) note(kind, outcome string) {
	if outcome == "" {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.outcomes == nil {
		n.outcomes = map[string]int{}
	}
	n.outcomes[kind+": "+outcome]++
}

// storageOutcomes lists how the storage faults ended, sorted.
func (n *nemesis) storageOutcomes() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for k, v := range n.outcomes {
		out = append(out, fmt.Sprintf("%s ×%d", k, v))
	}
	sort.Strings(out)
	return out
}
