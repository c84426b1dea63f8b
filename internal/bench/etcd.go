package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// etcdTarget is a connected etcd cluster.
type etcdTarget struct {
	clients []*clientv3.Client
	// leader is the endpoint the clients use: the leader's, or with
	// Config.ViaFollower a follower's.
	leader string
	// members maps member name to its first client URL.
	members map[string]string
	ttlSec  int
}

func newEtcdClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    30 * time.Second,
		DialKeepAliveTimeout: 10 * time.Second,
		Logger:               zap.NewNop(),
	})
}

func connectEtcd(ctx context.Context, cfg *Config) (*etcdTarget, error) {
	eps := make([]string, len(cfg.EtcdEndpoints))
	for i, e := range cfg.EtcdEndpoints {
		eps[i] = normalizeURL(e)
	}
	probe, err := newEtcdClient(eps)
	if err != nil {
		return nil, fmt.Errorf("connect to etcd %v: %w", eps, err)
	}
	defer probe.Close()
	t := &etcdTarget{members: map[string]string{}, ttlSec: int(cfg.TTL / time.Second)}
	deadline := time.Now().Add(15 * time.Second)
	for t.leader == "" {
		for _, ep := range eps {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			st, err := probe.Status(cctx, ep)
			cancel()
			if err == nil && st.Leader != 0 && (st.Leader == st.Header.MemberId) != cfg.ViaFollower {
				t.leader = ep
				break
			}
		}
		if t.leader == "" {
			if time.Now().After(deadline) {
				if cfg.ViaFollower {
					return nil, fmt.Errorf("no etcd follower that knows a leader among %v", eps)
				}
				return nil, fmt.Errorf("no etcd leader among %v", eps)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	ml, err := probe.MemberList(cctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("etcd member list: %w", err)
	}
	for _, m := range ml.Members {
		if len(m.ClientURLs) > 0 {
			t.members[m.Name] = m.ClientURLs[0]
		}
	}
	use := []string{t.leader}
	if cfg.EtcdAllEndpoints {
		use = eps
	}
	for range cfg.EtcdClients {
		c, err := newEtcdClient(use)
		if err != nil {
			t.close()
			return nil, err
		}
		t.clients = append(t.clients, c)
	}
	return t, nil
}

func (t *etcdTarget) close() {
	for _, c := range t.clients {
		c.Close()
	}
}

func (t *etcdTarget) client(w int) *clientv3.Client { return t.clients[w%len(t.clients)] }

func runEtcd(ctx context.Context, cfg *Config, res *Result) error {
	t, err := connectEtcd(ctx, cfg)
	if err != nil {
		return err
	}
	defer t.close()
	res.Config["leader"] = t.leader
	res.Config["etcd_clients"] = fmt.Sprint(len(t.clients))
	switch {
	case cfg.EtcdAllEndpoints:
		res.Notes = append(res.Notes, "the etcd clients balance over every endpoint")
	case cfg.ViaFollower:
		res.Config["via_follower"] = t.leader
		delete(res.Config, "leader")
		res.Notes = append(res.Notes, "requests go to one follower member's endpoint only (found with the Status RPC); it forwards proposals to the leader")
	default:
		res.Notes = append(res.Notes, "requests go to the etcd leader's endpoint only (found with the Status RPC), as dlock's go to its leader")
	}
	id := runID()
	logf(cfg, "etcd %s: %d workers over %d clients, leader %s, run %s", cfg.Workload, cfg.Workers, len(t.clients), t.leader, id)
	switch cfg.Workload {
	case "uncontended", "session", "contended":
		meter := startCPUMeter(ctx, cfg, metricsURLs(t.members))
		if cfg.TTLPerAcquire {
			err = etcdTTLPerAcquire(ctx, cfg, res, t, id)
		} else {
			err = etcdMutexLoop(ctx, cfg, res, t, id, cfg.Workload)
		}
		if err != nil {
			meter.abandon()
			return err
		}
		meter.finish(res)
		return nil
	case "held":
		return etcdHeld(ctx, cfg, res, t, id)
	case "watch":
		return etcdWatch(ctx, cfg, res, t, id)
	}
	return fmt.Errorf("workload %q is not implemented for etcd", cfg.Workload)
}

// etcdMutexLoop is uncontended, session and contended: one session per worker,
// concurrency.Mutex Lock/Unlock on the worker's own name, a rotating set of
// names, or one shared name.
func etcdMutexLoop(ctx context.Context, cfg *Config, res *Result, t *etcdTarget, id, kind string) error {
	rec := window(cfg)
	pace := newPacer(cfg.Rate)
	var setupErr error
	var once sync.Once
	runWorkers(ctx, cfg.Workers, rec, func(ctx, stop context.Context, w int) {
		cli := t.client(w)
		sess, err := concurrency.NewSession(cli, concurrency.WithTTL(t.ttlSec), concurrency.WithContext(ctx))
		if err != nil {
			once.Do(func() { setupErr = fmt.Errorf("etcd session: %w", err) })
			return
		}
		defer sess.Close()
		for j := 0; pace.wait(stop); j++ {
			var name string
			switch kind {
			case "uncontended":
				name = fmt.Sprintf("/bench/%s/u/w%d", id, w)
			case "session":
				name = fmt.Sprintf("/bench/%s/s/w%d/k%d", id, w, j%cfg.Names)
			default:
				name = fmt.Sprintf("/bench/%s/c", id)
			}
			m := concurrency.NewMutex(sess, name)
			t0 := time.Now()
			lctx, cancel := context.WithTimeout(ctx, cfg.WaitTimeout)
			err := m.Lock(lctx)
			cancel()
			if err != nil {
				rec.fail("acquire", err)
				if !pause(stop, 10*time.Millisecond) {
					return
				}
				continue
			}
			t1 := rec.observe("acquire", t0)
			if err := m.Unlock(ctx); err != nil {
				rec.fail("release", err)
				continue
			}
			t2 := rec.observe("release", t1)
			rec.record("cycle", t2, t2.Sub(t0))
		}
	})
	if setupErr != nil {
		return setupErr
	}
	rec.fill(res, cfg.CDF)
	switch kind {
	case "contended":
		res.Throughput, res.ThroughputUnit = res.Ops["acquire"].PerSec, "hand-offs"
		res.Notes = append(res.Notes, fmt.Sprintf("every worker on one concurrency.Mutex with its own session (ttl %d s); "+
			"hand-offs/s counts grants; the Lock latency is the wait-time distribution", t.ttlSec))
	case "session":
		res.Throughput, res.ThroughputUnit = res.Ops["cycle"].PerSec, "cycles"
		res.Notes = append(res.Notes, fmt.Sprintf("each worker: one session (ttl %d s), concurrency.Mutex Lock/Unlock on %d names in turn", t.ttlSec, cfg.Names))
	default:
		res.Throughput, res.ThroughputUnit = res.Ops["cycle"].PerSec, "cycles"
		res.Notes = append(res.Notes, fmt.Sprintf("each worker: one session (lease, ttl %d s) for the whole run, concurrency.Mutex Lock/Unlock on its own name", t.ttlSec))
	}
	return nil
}

// etcdTTLPerAcquire grants a lease for every acquire: NewSession (Grant +
// keep-alive stream), Mutex.Lock; then Unlock and Session.Close (Revoke).
func etcdTTLPerAcquire(ctx context.Context, cfg *Config, res *Result, t *etcdTarget, id string) error {
	rec := window(cfg)
	pace := newPacer(cfg.Rate)
	runWorkers(ctx, cfg.Workers, rec, func(ctx, stop context.Context, w int) {
		cli := t.client(w)
		name := fmt.Sprintf("/bench/%s/t/w%d", id, w)
		for pace.wait(stop) {
			t0 := time.Now()
			sess, err := concurrency.NewSession(cli, concurrency.WithTTL(t.ttlSec), concurrency.WithContext(ctx))
			if err != nil {
				rec.fail("acquire", err)
				if !pause(stop, 10*time.Millisecond) {
					return
				}
				continue
			}
			m := concurrency.NewMutex(sess, name)
			if err := m.Lock(ctx); err != nil {
				rec.fail("acquire", err)
				sess.Close()
				continue
			}
			t1 := rec.observe("acquire", t0)
			err = m.Unlock(ctx)
			if cerr := sess.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				rec.fail("release", err)
				continue
			}
			t2 := rec.observe("release", t1)
			rec.record("cycle", t2, t2.Sub(t0))
		}
	})
	rec.fill(res, cfg.CDF)
	res.Throughput, res.ThroughputUnit = res.Ops["cycle"].PerSec, "cycles"
	res.Notes = append(res.Notes, fmt.Sprintf("every acquire grants its own lease (ttl %d s): acquire = NewSession (Grant) + Mutex.Lock; "+
		"release = Mutex.Unlock + Session.Close (Revoke)", t.ttlSec))
	return nil
}

// etcdHeld holds K keys, each under its own lease, put the way Mutex.Lock's
// uncontended path does (a put-if-absent transaction), and renews the leases
// round-robin with KeepAliveOnce.
func etcdHeld(ctx context.Context, cfg *Config, res *Result, t *etcdTarget, id string) error {
	metrics := metricsURLs(t.members)
	hc := newHTTPClient(4, 30*time.Second)
	res.Memory = append(res.Memory, memoryOf(ctx, hc, "before", metrics)...)
	ttlSec := int64(cfg.HeldTTL / time.Second)
	leases := make([]clientv3.LeaseID, cfg.Keys)
	acq := newRecorder(time.Now(), time.Now().Add(24*time.Hour))
	start := time.Now()
	var wg sync.WaitGroup
	var failed error
	var failOnce sync.Once
	for w := range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cli := t.client(w)
			for j := w; j < cfg.Keys; j += cfg.Workers {
				key := fmt.Sprintf("/bench/%s/h/k%d/lock", id, j)
				t0 := time.Now()
				g, err := cli.Grant(ctx, ttlSec)
				if err == nil {
					var tr *clientv3.TxnResponse
					tr, err = cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
						Then(clientv3.OpPut(key, "", clientv3.WithLease(g.ID))).Commit()
					if err == nil && !tr.Succeeded {
						err = errors.New("key already exists")
					}
				}
				if err != nil {
					failOnce.Do(func() { failed = fmt.Errorf("etcd held: take %s: %w", key, err) })
					return
				}
				acq.observe("acquire", t0)
				leases[j] = g.ID
			}
		}()
	}
	wg.Wait()
	if failed != nil {
		return failed
	}
	acqSecs := time.Since(start).Seconds()
	res.Memory = append(res.Memory, memoryOf(ctx, hc, "acquired", metrics)...)
	logf(cfg, "held: %d etcd keys taken in %.1f s; renewing for %s", cfg.Keys, acqSecs, cfg.Duration)

	rec := window(cfg)
	memDone := make(chan []NodeMemory, 1)
	go func() {
		time.Sleep(time.Until(rec.start.Add(cfg.Duration * 9 / 10)))
		memDone <- memoryOf(ctx, hc, "renewing", metrics)
	}()
	runWorkers(ctx, cfg.Workers, rec, func(ctx, stop context.Context, w int) {
		cli := t.client(w)
		for j := w; stop.Err() == nil; j += cfg.Workers {
			if j >= cfg.Keys {
				j = w
				if j >= cfg.Keys {
					return
				}
			}
			t0 := time.Now()
			if _, err := cli.KeepAliveOnce(ctx, leases[j]); err != nil {
				rec.fail("renew", err)
				if !pause(stop, 10*time.Millisecond) {
					return
				}
				continue
			}
			rec.observe("renew", t0)
		}
	})
	res.Memory = append(res.Memory, <-memDone...)
	rec.fill(res, cfg.CDF)
	res.Throughput, res.ThroughputUnit = res.Ops["renew"].PerSec, "renewals"
	s := acq.hist("acquire").Summarize(cfg.CDF)
	res.Ops["acquire (setup)"] = OpResult{PerSec: round3(float64(s.Count) / acqSecs), Summary: s}
	if cfg.HeldRelease {
		rel := newRecorder(time.Now(), time.Now().Add(24*time.Hour))
		start := time.Now()
		runWorkers(ctx, cfg.Workers, rel, func(ctx, _ context.Context, w int) {
			cli := t.client(w)
			for j := w; j < cfg.Keys; j += cfg.Workers {
				t0 := time.Now()
				if _, err := cli.Revoke(ctx, leases[j]); err != nil {
					rel.fail("release", err)
					continue
				}
				rel.observe("release", t0)
			}
		})
		s := rel.hist("release").Summarize(cfg.CDF)
		res.Ops["release (teardown)"] = OpResult{PerSec: round3(float64(s.Count) / time.Since(start).Seconds()), Summary: s}
	}
	res.Config["keys"] = fmt.Sprint(cfg.Keys)
	res.Config["held_ttl"] = cfg.HeldTTL.String()
	res.Notes = append(res.Notes, fmt.Sprintf("%d keys, each under its own lease (Grant, then the put-if-absent Txn of Mutex.Lock's uncontended path), "+
		"renewed round-robin with KeepAliveOnce (etcd 3.4 keeps lease renewals on the leader, in memory: they are not Raft commits, unlike dlock's); "+
		"memory from each member's /metrics", cfg.Keys))
	return nil
}

// etcdWatch: watchers on every member (one client per member endpoint) watch
// the prefix; workers Lock/Unlock their own mutex; a grant is the creation of
// the mutex key, matched by key and revision.
func etcdWatch(ctx context.Context, cfg *Config, res *Result, t *etcdTarget, id string) error {
	nodes := sortedKeys(t.members)
	if len(nodes) == 0 {
		return errors.New("etcd member list has no client URLs")
	}
	prefix := fmt.Sprintf("/bench/%s/watch/", id)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var dlMu sync.Mutex
	var dl *delivery
	cur := func() *delivery { dlMu.Lock(); defer dlMu.Unlock(); return dl }
	dl = newDelivery(nodes, newRecorder(time.Now(), time.Now()))
	var watchers []*clientv3.Client
	defer func() {
		for _, c := range watchers {
			c.Close()
		}
	}()
	for _, node := range nodes {
		c, err := newEtcdClient([]string{t.members[node]})
		if err != nil {
			return err
		}
		watchers = append(watchers, c)
		wch := c.Watch(clientv3.WithRequireLeader(wctx), prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		first, ok := <-wch
		if !ok || !first.Created {
			return fmt.Errorf("etcd watch on %s did not start: %v", node, first.Err())
		}
		go func() {
			for wr := range wch {
				at := time.Now()
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypePut && ev.IsCreate() {
						cur().event(node, fmt.Sprintf("%s#%d", ev.Kv.Key, ev.Kv.ModRevision), at)
					}
				}
			}
		}()
	}
	rec := window(cfg)
	dlMu.Lock()
	dl = newDelivery(nodes, rec)
	dlMu.Unlock()
	pace := newPacer(cfg.Rate)
	var setupErr error
	var once sync.Once
	runWorkers(ctx, cfg.Workers, rec, func(ctx, stop context.Context, w int) {
		sess, err := concurrency.NewSession(t.client(w), concurrency.WithTTL(t.ttlSec), concurrency.WithContext(ctx))
		if err != nil {
			once.Do(func() { setupErr = err })
			return
		}
		defer sess.Close()
		m := concurrency.NewMutex(sess, fmt.Sprintf("%sw%d", prefix, w))
		for pace.wait(stop) {
			t0 := time.Now()
			if err := m.Lock(ctx); err != nil {
				rec.fail("acquire", err)
				continue
			}
			t1 := rec.observe("acquire", t0)
			// Uncontended, Lock returns its put transaction's header: its
			// revision is the key's ModRevision in the watch event.
			dl.acked(fmt.Sprintf("%s#%d", m.Key(), m.Header().Revision), t1)
			if err := m.Unlock(ctx); err != nil {
				rec.fail("release", err)
				continue
			}
			rec.observe("release", t1)
		}
	})
	if setupErr != nil {
		return setupErr
	}
	for deadline := time.Now().Add(2 * time.Second); dl.outstanding() > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	stopWatch()
	dl.finish()
	rec.fill(res, cfg.CDF)
	res.Throughput, res.ThroughputUnit = res.Ops["acquire"].PerSec, "grants"
	res.Config["watch_nodes"] = fmt.Sprint(len(nodes))
	res.Notes = append(res.Notes,
		"delivery = arrival of the lock key's creation event at a watcher minus arrival of Mutex.Lock's answer (the commit-time proxy); "+
			"one watch per member, each through a client connected to that member only; `delivery (all nodes)` is the slowest member per grant")
	return nil
}

// etcdSystem runs etcd member processes for the failover workload.
type etcdSystem struct {
	initial, token string
	extra          []string
	mu             sync.Mutex
	// clients holds one client per node, connected to that node only.
	clients map[string]*clientv3.Client
}

func (e *etcdSystem) args(n *procNode, _ bool) []string {
	// The --initial-* flags only matter on the first start; a restart finds
	// its data dir and ignores them.
	a := []string{"--name", n.id, "--data-dir", n.dir,
		"--listen-client-urls", n.url(), "--advertise-client-urls", n.url(),
		"--listen-peer-urls", "http://" + n.peer, "--initial-advertise-peer-urls", "http://" + n.peer,
		"--initial-cluster", e.initial, "--initial-cluster-state", "new", "--initial-cluster-token", e.token,
		"--logger", "zap", "--log-level", "warn"}
	return append(a, e.extra...)
}

func (e *etcdSystem) client(n *procNode) (*clientv3.Client, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := e.clients[n.id]; c != nil {
		return c, nil
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{n.url()}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	e.clients[n.id] = c
	return c, nil
}

func (e *etcdSystem) drop(n *procNode) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := e.clients[n.id]; c != nil {
		c.Close()
		delete(e.clients, n.id)
	}
}

func (e *etcdSystem) leader(ctx context.Context, nodes []*procNode) (*procNode, error) {
	var leader uint64
	byID := map[uint64]*procNode{}
	for _, n := range nodes {
		c, err := e.client(n)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.id, err)
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := c.Status(cctx, n.url())
		cancel()
		if err != nil {
			e.drop(n)
			return nil, fmt.Errorf("%s: %w", n.id, err)
		}
		if st.Leader == 0 || (leader != 0 && st.Leader != leader) {
			return nil, fmt.Errorf("%s names leader %x, others %x", n.id, st.Leader, leader)
		}
		if st.RaftIndex > st.RaftAppliedIndex+1000 {
			return nil, fmt.Errorf("%s is catching up", n.id)
		}
		leader = st.Leader
		byID[st.Header.MemberId] = n
	}
	if n := byID[leader]; n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("leader %x is not one of the started members", leader)
}

func (e *etcdSystem) warm(ctx context.Context, survivors []*procNode) error {
	// Fresh clients: one to a restarted member may sit in gRPC's reconnect
	// back-off.
	for _, n := range survivors {
		e.drop(n)
		if _, err := e.client(n); err != nil {
			return err
		}
	}
	return nil
}

func (e *etcdSystem) probe(ctx context.Context, n *procNode, name string) error {
	c, err := e.client(n)
	if err != nil {
		return err
	}
	sess, err := concurrency.NewSession(c, concurrency.WithTTL(10), concurrency.WithContext(ctx))
	if err != nil {
		return err
	}
	// The lease expires by itself; no keep-alive beyond this attempt.
	defer sess.Orphan()
	return concurrency.NewMutex(sess, "/"+name).Lock(ctx)
}

func (e *etcdSystem) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, c := range e.clients {
		c.Close()
		delete(e.clients, id)
	}
}
