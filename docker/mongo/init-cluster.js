// One-shot (service mongo-init-cluster), run through mongos: adds both shards and shards two of the
// demo's collections on a hashed _id, so their documents spread over both shards and the CDC DAG
// maps one snapshot/pull per shard. inventory.products stays unsharded (on the primary shard).
// Idempotent: what exists already is left as it is. The documents are loaded afterwards by the
// service inventory-data (python -m mongo_cdc_airflow.demo --load-into ...).
const shards = { shard1: "shard1/mongo-shard1:27018", shard2: "shard2/mongo-shard2:27018" };
const config = db.getSiblingDB("config");

for (const [id, hosts] of Object.entries(shards)) {
  if (config.shards.countDocuments({ _id: id }) === 0) {
    sh.addShard(hosts);
  }
  print(`shard ${id}: ${hosts}`);
}
sh.enableSharding("inventory");
for (const namespace of ["inventory.customers", "inventory.orders"]) {
  if (config.collections.countDocuments({ _id: namespace }) === 0) {
    sh.shardCollection(namespace, { _id: "hashed" });
  }
  print(`${namespace} sharded on { _id: "hashed" }`);
}
