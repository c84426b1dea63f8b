// Takes, contends for and releases a lock over dlock's gRPC API, with a client
// generated from the proto at load time. Usage: node client.js HOST:GRPC_PORT
const path = require('path');
const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');

const proto = path.join(__dirname, '..', '..', 'api', 'dlock', 'v1', 'dlock.proto');
const v1 = grpc.loadPackageDefinition(loader.loadSync(proto, { keepCase: true, longs: String })).dlock.v1;
const addr = process.argv[2] || '127.0.0.1:7072';
const creds = grpc.credentials.createInsecure();
const locks = new v1.LockService(addr, creds);
const cluster = new v1.ClusterService(addr, creds);

const call = (svc, method, req) =>
  new Promise((resolve, reject) => svc[method](req, (err, res) => (err ? reject(err) : resolve(res))));

async function main() {
  const c = await call(cluster, 'GetCluster', {});
  console.log('leader:', c.cluster.leader_id);
  const a = await call(locks, 'Acquire', { name: 'from-node', client_id: 'node-1', ttl_ms: 10000 });
  console.log('node-1 acquired, fencing token', a.fencing_token);
  try {
    await call(locks, 'Acquire', { name: 'from-node', client_id: 'node-2', ttl_ms: 10000 });
    throw new Error('node-2 got a held lock');
  } catch (err) {
    if (err.code !== grpc.status.FAILED_PRECONDITION) throw err;
    console.log('node-2 refused as expected:', err.details);
  }
  const r = await call(locks, 'Release', { name: 'from-node', client_id: 'node-1', fencing_token: a.fencing_token, lease_id: a.lease_id });
  console.log('released:', r.released);
}

main().then(() => process.exit(0), (err) => { console.error(err.message); process.exit(1); });
