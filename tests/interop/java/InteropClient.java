// The Apache Kafka Java client, driven by the interoperability tests.
//
// Usage: java InteropClient COMMAND 'JSON-OPTIONS'   (records on stdin / results on stdout)
//        java InteropClient batch   (stdin: one {"command", "options", "records"?} line per step;
//                                    stdout: one {"command", "results": [...]} line per step)
//
// Every command takes "bootstrap" in its options, and "configs" ({name: value}) that are added
// to the client's properties. Bytes travel as base64 strings, null as null.
// A record line is {"key": b64|null, "value": b64|null, "headers": [[name, b64|null], ...],
//                   "partition": int|null, "timestamp": int|null}.
//
//   produce         {topic, acks, compression, idempotence, partition?, configs?,
//                    transactional_id?, end?: "commit"|"abort"}
//                   stdin: record lines. stdout: one {"partition","offset","timestamp"} line per
//                   record, in input order. With transactional_id every record is sent in one
//                   transaction (initTransactions, beginTransaction), which is committed, or
//                   aborted after a flush when end is "abort".
//   consume         {topic, partitions?, offsets?: {"P": offset}, from?: "beginning"|"end",
//                    max_records, timeout_ms, group?}  (group: subscribe instead of assign)
//                   stdout: {"partition","offset","timestamp","key","value","headers"} lines.
//   metadata        {topic?} -> {"nodes": [...], "topics": {name: [{partition, leader, replicas,
//                    isr}]}, "controller": id}
//   create-topic    {topic, partitions, replication?, topic_configs?} -> {}
//   list-topics     {} -> {"topics": [names]}
//   describe-topic  {topic} -> {"name", "partitions": [{partition, leader, replicas, isr}]}
//   describe-configs {topic | broker} -> {"configs": {name: value}}
//   alter-configs   {topic | broker, set?: {name: value}, delete?: [names]} -> {}  (incremental)
//                   broker: a node id, or "" for the cluster-wide broker default.
//   create-partitions {topic, total} -> {}
//   delete-topic    {topic} -> {}
//   list-offsets    {topic, partitions, spec: "earliest"|"latest"|"timestamp", timestamp?}
//                   -> {"P": {"offset", "timestamp"}}  (admin ListOffsets)
//   transactions    {describe?: [transactional ids]} -> {"listed": {id: {"producer_id",
//                    "state"}}, "described": {id: {"state", "producer_id", "epoch",
//                    "timeout_ms", "partitions": ["topic-P", ...]}}}  (admin listTransactions,
//                    describeTransactions)
//   acls            {create?: [acl], describe?: filter, delete?: [filter]}  (admin createAcls,
//                    describeAcls, deleteAcls) -> {"created": [null | error class, per acl],
//                    "described": [acl] | {"error"}, "deleted": [[acl] | {"error"}, per filter]}.
//                   An acl is {resource_type, name, pattern, principal, host, operation,
//                   permission} with Java's enum names (TOPIC, PREFIXED, READ, ALLOW); a
//                   filter the same, with ANY/MATCH values and null for any name.
//   elect-leaders   {type: "preferred"|"unclean", partitions: ["topic-P", ...] | null}
//                   -> {"topic-P": null | error class}  (admin electLeaders; null: all)
//   reassignments   {alter?: {"topic-P": [broker ids] | null}, list?: ["topic-P"] | "all"}
//                   -> {"altered": {"topic-P": null | error class}, "listed": {"topic-P":
//                   {"replicas", "adding", "removing"}}}  (admin alterPartitionReassignments,
//                   null cancels; listPartitionReassignments)
//   describe-quorum {} -> {"leader", "epoch", "high_watermark", "voters": [ids]}
//                   (admin describeMetadataQuorum, through the bootstrap broker)
//   offsets-for-times {topic, timestamps: {"P": ts}} -> {"P": {"offset","timestamp"}|null}
//                   (consumer offsetsForTimes, plus "beginning"/"end" from the consumer too)
//   group-member    {topic, group, configs?}  (not in batch; runs until "stop" or end of stdin)
//                   A long-lived group member for the consumer-group tests: subscribes, prints
//                   {"event": "assigned"|"revoked"|"lost", "partitions", "owned", "generation"}
//                   from its rebalance listener, {"event": "record", "partition", "offset",
//                   "value" (UTF-8 text)} per record, and after each polled batch commits the
//                   next offset of every partition in it synchronously, then prints
//                   {"event": "committed", "offsets": {"P": next}} (or "commit_failed"). A
//                   "stop" line on stdin closes the consumer and prints {"event": "closed"}.
//   eos-loop        {input, output, group, transactional_id, total, batch, configs?}  (not in
//                   batch) A consume-transform-produce loop for the exactly-once tests: reads
//                   input in group (read_committed), sends "out-<id>" for each "in-<id>" to
//                   the same partition of output, and commits every poll of up to batch records
//                   in one transaction with its offsets (sendOffsetsToTransaction). Prints
//                   {"event": "acked", "n"} per acknowledged output record and {"event":
//                   "committed", "n"} per commit (n: since start). Exits 0 once the group's
//                   committed offsets cover total input records, 3 when it cannot go on
//                   (fenced, or a transaction it can neither commit nor abort).
//
// A failure prints {"error": class, "message": text} on stdout and exits with status 1.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.DeleteAclsResult;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.PartitionReassignment;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.QuorumInfo;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AccessControlEntryFilter;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourcePatternFilter;
import org.apache.kafka.common.resource.ResourceType;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class InteropClient {
    private static final Base64.Encoder B64E = Base64.getEncoder();
    private static final Base64.Decoder B64D = Base64.getDecoder();

    public static void main(String[] args) {
        if (args.length < 1) {
            System.err.println("usage: InteropClient COMMAND [JSON-OPTIONS]");
            System.exit(2);
        }
        try {
            if (args[0].equals("eos-loop")) {
                int status = eosLoop(args.length > 1 ? asMap(Json.parse(args[1])) : new HashMap<>());
                System.out.flush();
                System.exit(status);
            }
            if (args[0].equals("group-member")) {
                // stdin is its control channel, read while it runs, not a list of steps.
                groupMember(args.length > 1 ? asMap(Json.parse(args[1])) : new HashMap<>());
                System.out.flush();
                System.exit(0);
            }
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            List<Map<String, Object>> lines = new ArrayList<>();
            String line;
            while ((line = in.readLine()) != null) {
                if (!line.isBlank()) lines.add(asMap(Json.parse(line)));
            }
            if (args[0].equals("batch")) {
                // One JVM, several steps: each stdin line is {"command", "options", "records"?};
                // each step answers one line {"command", "results": [...]}.
                for (Map<String, Object> step : lines) {
                    List<Map<String, Object>> records = new ArrayList<>();
                    if (step.get("records") != null) {
                        for (Object r : (List<?>) step.get("records")) records.add(asMap(r));
                    }
                    Map<String, Object> opts = step.get("options") == null ? new HashMap<>() : asMap(step.get("options"));
                    String command = String.valueOf(step.get("command"));
                    Map<String, Object> out = new LinkedHashMap<>();
                    out.put("command", command);
                    out.put("results", execute(command, opts, records));
                    System.out.println(Json.write(out));
                    System.out.flush();
                }
            } else {
                Map<String, Object> opts = args.length > 1 ? asMap(Json.parse(args[1])) : new HashMap<>();
                for (Object result : execute(args[0], opts, lines)) System.out.println(Json.write(result));
            }
            System.out.flush();
            System.exit(0);
        } catch (Throwable t) {
            Throwable cause = t;
            while ((cause instanceof ExecutionException) && cause.getCause() != null) {
                cause = cause.getCause();
            }
            Map<String, Object> err = new LinkedHashMap<>();
            err.put("error", cause.getClass().getName());
            err.put("message", String.valueOf(cause.getMessage()));
            System.out.println(Json.write(err));
            cause.printStackTrace(System.err);
            System.out.flush();
            System.exit(1);
        }
    }

    private static List<Object> execute(String command, Map<String, Object> o, List<Map<String, Object>> records)
            throws Exception {
        switch (command) {
            case "produce": return produce(o, records);
            case "consume": return consume(o);
            case "offsets-for-times": return List.of(offsetsForTimes(o));
            default: break;
        }
        try (Admin admin = Admin.create(adminProps(o))) {
            Object result;
            switch (command) {
                case "metadata": result = metadata(admin, o); break;
                case "create-topic": result = createTopic(admin, o); break;
                case "list-topics": result = listTopics(admin); break;
                case "describe-topic": result = describeTopic(admin, str(o, "topic")); break;
                case "describe-configs": result = describeConfigs(admin, o); break;
                case "alter-configs": result = alterConfigs(admin, o); break;
                case "create-partitions": result = createPartitions(admin, o); break;
                case "delete-topic": result = deleteTopic(admin, o); break;
                case "list-offsets": result = listOffsets(admin, o); break;
                case "transactions": result = transactions(admin, o); break;
                case "acls": result = acls(admin, o); break;
                case "describe-quorum": result = describeQuorum(admin); break;
                case "elect-leaders": result = electLeaders(admin, o); break;
                case "reassignments": result = reassignments(admin, o); break;
                case "quotas": result = quotas(admin, o); break;
                default: throw new IllegalArgumentException("unknown command " + command);
            }
            return List.of(result);
        }
    }

    // ---- producer -------------------------------------------------------------------------

    private static List<Object> produce(Map<String, Object> o, List<Map<String, Object>> records) throws Exception {
        Properties p = base(o);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.ACKS_CONFIG, String.valueOf(o.getOrDefault("acks", "all")));
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, String.valueOf(o.getOrDefault("compression", "none")));
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, String.valueOf(o.getOrDefault("idempotence", true)));
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "15000");
        putAll(p, o.get("configs"));
        String topic = str(o, "topic");
        Object defaultPartition = o.get("partition");
        String transactionalId = (String) o.get("transactional_id");
        if (transactionalId != null) p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            if (transactionalId != null) {
                producer.initTransactions();
                producer.beginTransaction();
            }
            for (Map<String, Object> r : records) {
                Object part = r.get("partition") != null ? r.get("partition") : defaultPartition;
                Integer partition = part == null ? null : ((Number) part).intValue();
                Long ts = r.get("timestamp") == null ? null : ((Number) r.get("timestamp")).longValue();
                List<Header> headers = new ArrayList<>();
                Object hs = r.get("headers");
                if (hs != null) {
                    for (Object h : (List<?>) hs) {
                        List<?> pair = (List<?>) h;
                        headers.add(new RecordHeader((String) pair.get(0), bytes(pair.get(1))));
                    }
                }
                sent.add(producer.send(new ProducerRecord<>(topic, partition, ts,
                        bytes(r.get("key")), bytes(r.get("value")), headers)));
            }
            producer.flush();
            if (transactionalId != null) {
                if ("abort".equals(o.get("end"))) producer.abortTransaction();
                else producer.commitTransaction();
            }
            List<Object> results = new ArrayList<>();
            for (Future<RecordMetadata> f : sent) {
                RecordMetadata md = f.get();
                Map<String, Object> out = new LinkedHashMap<>();
                out.put("partition", md.partition());
                out.put("offset", md.offset());
                out.put("timestamp", md.timestamp());
                results.add(out);
            }
            return results;
        }
    }

    // ---- consumer -------------------------------------------------------------------------

    private static Properties consumerProps(Map<String, Object> o) {
        Properties p = base(o);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        putAll(p, o.get("configs"));
        return p;
    }

    private static List<Object> consume(Map<String, Object> o) throws Exception {
        List<Object> results = new ArrayList<>();
        Properties p = consumerProps(o);
        String topic = str(o, "topic");
        String group = (String) o.get("group");
        if (group != null) p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        int max = ((Number) o.getOrDefault("max_records", Integer.MAX_VALUE)).intValue();
        long timeoutMs = ((Number) o.getOrDefault("timeout_ms", 20000)).longValue();
        int printed = 0;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
            if (group != null) {
                consumer.subscribe(Collections.singletonList(topic));
            } else {
                List<TopicPartition> tps = new ArrayList<>();
                Object parts = o.get("partitions");
                if (parts == null) {
                    for (PartitionInfo pi : consumer.partitionsFor(topic, Duration.ofMillis(timeoutMs))) {
                        tps.add(new TopicPartition(topic, pi.partition()));
                    }
                } else {
                    for (Object n : (List<?>) parts) tps.add(new TopicPartition(topic, ((Number) n).intValue()));
                }
                consumer.assign(tps);
                Map<String, Object> offsets = o.get("offsets") == null ? null : asMap(o.get("offsets"));
                String from = String.valueOf(o.getOrDefault("from", "beginning"));
                for (TopicPartition tp : tps) {
                    Object off = offsets == null ? null : offsets.get(String.valueOf(tp.partition()));
                    if (off != null) consumer.seek(tp, ((Number) off).longValue());
                    else if (from.equals("end")) consumer.seekToEnd(Collections.singletonList(tp));
                    else consumer.seekToBeginning(Collections.singletonList(tp));
                }
            }
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (printed < max && System.currentTimeMillis() < deadline) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(200));
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    if (printed >= max) break;
                    Map<String, Object> out = new LinkedHashMap<>();
                    out.put("partition", r.partition());
                    out.put("offset", r.offset());
                    out.put("timestamp", r.timestamp());
                    out.put("timestamp_type", r.timestampType().name);
                    out.put("key", b64(r.key()));
                    out.put("value", b64(r.value()));
                    List<Object> hs = new ArrayList<>();
                    for (Header h : r.headers()) hs.add(List.of(h.key(), b64(h.value())));
                    out.put("headers", hs);
                    results.add(out);
                    printed++;
                }
            }
            if (group != null && printed > 0) consumer.commitSync();
        }
        return results;
    }

    private static synchronized void emit(Map<String, Object> event) {
        System.out.println(Json.write(event));
        System.out.flush();
    }

    private static List<Object> partitionList(Collection<TopicPartition> parts) {
        List<Object> out = new ArrayList<>();
        for (TopicPartition tp : parts) out.add(tp.partition());
        Collections.sort(out, (a, b) -> Integer.compare((Integer) a, (Integer) b));
        return out;
    }

    private static void groupMember(Map<String, Object> o) throws Exception {
        Properties p = consumerProps(o);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, str(o, "group"));
        String topic = str(o, "topic");
        AtomicBoolean stop = new AtomicBoolean();
        Thread control = new Thread(() -> {
            try {
                BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
                String line;
                while ((line = in.readLine()) != null && !line.trim().equals("stop")) { }
            } catch (java.io.IOException e) {
                // end of the control channel: stop as for "stop"
            }
            stop.set(true);
        });
        control.setDaemon(true);
        control.start();
        java.util.TreeSet<Integer> owned = new java.util.TreeSet<>();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
            ConsumerRebalanceListener listener = new ConsumerRebalanceListener() {
                private void report(String event, Collection<TopicPartition> parts) {
                    Map<String, Object> out = new LinkedHashMap<>();
                    out.put("event", event);
                    out.put("partitions", partitionList(parts));
                    out.put("owned", new ArrayList<Object>(owned));
                    out.put("generation", consumer.groupMetadata().generationId());
                    emit(out);
                }

                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> parts) {
                    for (TopicPartition tp : parts) owned.remove(tp.partition());
                    report("revoked", parts);
                }

                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> parts) {
                    for (TopicPartition tp : parts) owned.add(tp.partition());
                    report("assigned", parts);
                }

                @Override
                public void onPartitionsLost(Collection<TopicPartition> parts) {
                    for (TopicPartition tp : parts) owned.remove(tp.partition());
                    report("lost", parts);
                }
            };
            consumer.subscribe(Collections.singletonList(topic), listener);
            // No wakeup(): it could abort a commit of records already printed. A poll is short.
            while (!stop.get()) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(200));
                Map<TopicPartition, OffsetAndMetadata> done = new HashMap<>();
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    Map<String, Object> out = new LinkedHashMap<>();
                    out.put("event", "record");
                    out.put("partition", r.partition());
                    out.put("offset", r.offset());
                    out.put("value", r.value() == null ? null : new String(r.value(), StandardCharsets.UTF_8));
                    emit(out);
                    done.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                }
                if (done.isEmpty()) continue;
                Map<String, Object> out = new LinkedHashMap<>();
                try {
                    consumer.commitSync(done);
                    Map<String, Object> offsets = new TreeMap<>();
                    for (Map.Entry<TopicPartition, OffsetAndMetadata> e : done.entrySet()) {
                        offsets.put(String.valueOf(e.getKey().partition()), e.getValue().offset());
                    }
                    out.put("event", "committed");
                    out.put("offsets", offsets);
                } catch (org.apache.kafka.common.KafkaException e) {
                    out.put("event", "commit_failed");
                    out.put("error", e.getClass().getName() + ": " + e.getMessage());
                }
                emit(out);
            }
        }
        Map<String, Object> closed = new LinkedHashMap<>();
        closed.put("event", "closed");
        emit(closed);
    }

    private static void emitCount(String event, long n) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("event", event);
        out.put("n", n);
        emit(out);
    }

    private static int eosLoop(Map<String, Object> o) throws Exception {
        String input = str(o, "input");
        String output = str(o, "output");
        long total = ((Number) o.get("total")).longValue();
        Properties cp = consumerProps(o);
        cp.put(ConsumerConfig.GROUP_ID_CONFIG, str(o, "group"));
        cp.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        cp.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, String.valueOf(o.get("batch")));
        // a killed member must leave the group quickly for its successor to get the input
        cp.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "2000");
        cp.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "300");
        Properties pp = base(o);
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        pp.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, str(o, "transactional_id"));
        // a transaction a killed process left open must not hold the LSO back for long
        pp.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "10000");
        pp.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        AtomicLong acked = new AtomicLong();
        long done = 0;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(cp);
             KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pp)) {
            producer.initTransactions();
            consumer.subscribe(Collections.singletonList(input));
            while (true) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(500));
                if (records.isEmpty()) {
                    if (committedTotal(consumer, input) >= total) return 0;
                    continue;
                }
                try {
                    producer.beginTransaction();
                    Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
                    for (ConsumerRecord<byte[], byte[]> r : records) {
                        String id = new String(r.value(), StandardCharsets.UTF_8).substring("in-".length());
                        byte[] value = ("out-" + id).getBytes(StandardCharsets.UTF_8);
                        producer.send(new ProducerRecord<>(output, r.partition(), r.key(), value), (md, e) -> {
                            if (e == null) emitCount("acked", acked.incrementAndGet());
                        });
                        next.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                    }
                    producer.sendOffsetsToTransaction(next, consumer.groupMetadata());
                    producer.commitTransaction();
                } catch (ProducerFencedException e) {
                    return 3;
                } catch (org.apache.kafka.common.KafkaException e) {
                    try {
                        producer.abortTransaction();
                    } catch (org.apache.kafka.common.KafkaException unrecoverable) {
                        return 3;
                    }
                    // read again from the group's committed offsets what the aborted one read
                    Map<TopicPartition, OffsetAndMetadata> committed = consumer.committed(consumer.assignment());
                    for (TopicPartition tp : consumer.assignment()) {
                        OffsetAndMetadata at = committed.get(tp);
                        if (at == null) consumer.seekToBeginning(Collections.singletonList(tp));
                        else consumer.seek(tp, at.offset());
                    }
                    continue;
                }
                done += records.count();
                emitCount("committed", done);
            }
        }
    }

    private static long committedTotal(KafkaConsumer<byte[], byte[]> consumer, String topic) {
        java.util.Set<TopicPartition> tps = new java.util.HashSet<>();
        for (PartitionInfo pi : consumer.partitionsFor(topic)) tps.add(new TopicPartition(topic, pi.partition()));
        long sum = 0;
        for (OffsetAndMetadata at : consumer.committed(tps).values()) if (at != null) sum += at.offset();
        return sum;
    }

    private static Object offsetsForTimes(Map<String, Object> o) {
        String topic = str(o, "topic");
        Map<TopicPartition, Long> query = new HashMap<>();
        for (Map.Entry<String, Object> e : asMap(o.get("timestamps")).entrySet()) {
            query.put(new TopicPartition(topic, Integer.parseInt(e.getKey())), ((Number) e.getValue()).longValue());
        }
        Map<String, Object> out = new TreeMap<>();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProps(o))) {
            Map<TopicPartition, OffsetAndTimestamp> found = consumer.offsetsForTimes(query, Duration.ofSeconds(20));
            Map<TopicPartition, Long> begin = consumer.beginningOffsets(query.keySet(), Duration.ofSeconds(20));
            Map<TopicPartition, Long> end = consumer.endOffsets(query.keySet(), Duration.ofSeconds(20));
            for (TopicPartition tp : query.keySet()) {
                OffsetAndTimestamp ot = found.get(tp);
                Map<String, Object> one = new LinkedHashMap<>();
                one.put("offset", ot == null ? null : ot.offset());
                one.put("timestamp", ot == null ? null : ot.timestamp());
                one.put("beginning", begin.get(tp));
                one.put("end", end.get(tp));
                out.put(String.valueOf(tp.partition()), one);
            }
        }
        return out;
    }

    // ---- admin ----------------------------------------------------------------------------

    private static Properties adminProps(Map<String, Object> o) {
        Properties p = base(o);
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "15000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
        putAll(p, o.get("configs"));
        return p;
    }

    private static Object metadata(Admin admin, Map<String, Object> o) throws Exception {
        DescribeClusterResult cluster = admin.describeCluster();
        List<Object> nodes = new ArrayList<>();
        for (Node n : cluster.nodes().get()) nodes.add(node(n));
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("cluster_id", cluster.clusterId().get());
        Node controller = cluster.controller().get();
        out.put("controller", controller == null ? null : controller.id());
        out.put("nodes", nodes);
        Map<String, Object> topics = new TreeMap<>();
        Collection<String> names = o.get("topic") != null
                ? List.of(str(o, "topic")) : admin.listTopics().names().get();
        for (String name : names) topics.put(name, describeTopic(admin, name).get("partitions"));
        out.put("topics", topics);
        return out;
    }

    private static Object describeQuorum(Admin admin) throws Exception {
        QuorumInfo quorum = admin.describeMetadataQuorum().quorumInfo().get();
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("leader", quorum.leaderId());
        out.put("epoch", quorum.leaderEpoch());
        out.put("high_watermark", quorum.highWatermark());
        List<Object> voters = new ArrayList<>();
        for (QuorumInfo.ReplicaState voter : quorum.voters()) voters.add(voter.replicaId());
        out.put("voters", voters);
        return out;
    }

    private static TopicPartition topicPartition(Object text) {
        String name = String.valueOf(text);
        int dash = name.lastIndexOf('-');
        return new TopicPartition(name.substring(0, dash), Integer.parseInt(name.substring(dash + 1)));
    }

    private static Object electLeaders(Admin admin, Map<String, Object> o) throws Exception {
        ElectionType type = "unclean".equals(o.get("type")) ? ElectionType.UNCLEAN : ElectionType.PREFERRED;
        java.util.Set<TopicPartition> partitions = null;
        if (o.get("partitions") != null) {
            partitions = new java.util.LinkedHashSet<>();
            for (Object tp : (List<?>) o.get("partitions")) partitions.add(topicPartition(tp));
        }
        Map<String, Object> out = new TreeMap<>();
        for (Map.Entry<TopicPartition, java.util.Optional<Throwable>> e
                : admin.electLeaders(type, partitions).partitions().get().entrySet()) {
            out.put(e.getKey().toString(), e.getValue().map(t -> t.getClass().getSimpleName()).orElse(null));
        }
        return out;
    }

    private static Object reassignments(Admin admin, Map<String, Object> o) throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        if (o.get("alter") != null) {
            Map<TopicPartition, java.util.Optional<NewPartitionReassignment>> wanted = new LinkedHashMap<>();
            for (Map.Entry<String, Object> e : asMap(o.get("alter")).entrySet()) {
                java.util.Optional<NewPartitionReassignment> target = java.util.Optional.empty();
                if (e.getValue() != null) {
                    List<Integer> replicas = new ArrayList<>();
                    for (Object b : (List<?>) e.getValue()) replicas.add(((Number) b).intValue());
                    target = java.util.Optional.of(new NewPartitionReassignment(replicas));
                }
                wanted.put(topicPartition(e.getKey()), target);
            }
            Map<String, Object> altered = new TreeMap<>();
            for (Map.Entry<TopicPartition, KafkaFuture<Void>> e
                    : admin.alterPartitionReassignments(wanted).values().entrySet()) {
                try {
                    e.getValue().get();
                    altered.put(e.getKey().toString(), null);
                } catch (ExecutionException err) {
                    altered.put(e.getKey().toString(), err.getCause().getClass().getSimpleName());
                }
            }
            out.put("altered", altered);
        }
        if (o.get("list") != null) {
            Map<TopicPartition, PartitionReassignment> found;
            if ("all".equals(o.get("list"))) {
                found = admin.listPartitionReassignments().reassignments().get();
            } else {
                java.util.Set<TopicPartition> partitions = new java.util.LinkedHashSet<>();
                for (Object tp : (List<?>) o.get("list")) partitions.add(topicPartition(tp));
                found = admin.listPartitionReassignments(partitions).reassignments().get();
            }
            Map<String, Object> listed = new TreeMap<>();
            for (Map.Entry<TopicPartition, PartitionReassignment> e : found.entrySet()) {
                Map<String, Object> one = new LinkedHashMap<>();
                one.put("replicas", new ArrayList<Object>(e.getValue().replicas()));
                one.put("adding", new ArrayList<Object>(e.getValue().addingReplicas()));
                one.put("removing", new ArrayList<Object>(e.getValue().removingReplicas()));
                listed.put(e.getKey().toString(), one);
            }
            out.put("listed", listed);
        }
        return out;
    }

    private static Map<String, Object> node(Node n) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("id", n.id());
        m.put("host", n.host());
        m.put("port", n.port());
        return m;
    }

    private static Object createTopic(Admin admin, Map<String, Object> o) throws Exception {
        int partitions = ((Number) o.getOrDefault("partitions", 1)).intValue();
        short replication = ((Number) o.getOrDefault("replication", 1)).shortValue();
        NewTopic topic = new NewTopic(str(o, "topic"), partitions, replication);
        if (o.get("topic_configs") != null) {
            Map<String, String> cfg = new HashMap<>();
            for (Map.Entry<String, Object> e : asMap(o.get("topic_configs")).entrySet()) {
                cfg.put(e.getKey(), String.valueOf(e.getValue()));
            }
            topic.configs(cfg);
        }
        admin.createTopics(List.of(topic)).all().get();
        return new LinkedHashMap<>();
    }

    private static Object transactions(Admin admin, Map<String, Object> o) throws Exception {
        Map<String, Object> listed = new TreeMap<>();
        for (TransactionListing l : admin.listTransactions().all().get()) {
            Map<String, Object> one = new LinkedHashMap<>();
            one.put("producer_id", l.producerId());
            one.put("state", l.state().toString());
            listed.put(l.transactionalId(), one);
        }
        Map<String, Object> described = new TreeMap<>();
        Object ids = o.get("describe");
        if (ids != null && !((List<?>) ids).isEmpty()) {
            List<String> wanted = new ArrayList<>();
            for (Object id : (List<?>) ids) wanted.add((String) id);
            for (Map.Entry<String, TransactionDescription> e
                    : admin.describeTransactions(wanted).all().get().entrySet()) {
                TransactionDescription d = e.getValue();
                Map<String, Object> one = new LinkedHashMap<>();
                one.put("state", d.state().toString());
                one.put("producer_id", d.producerId());
                one.put("epoch", d.producerEpoch());
                one.put("timeout_ms", d.transactionTimeoutMs());
                List<Object> parts = new ArrayList<>();
                for (TopicPartition tp : d.topicPartitions()) parts.add(tp.toString());
                Collections.sort(parts, (a, b) -> ((String) a).compareTo((String) b));
                one.put("partitions", parts);
                described.put(e.getKey(), one);
            }
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("listed", listed);
        out.put("described", described);
        return out;
    }

    // ---- client quotas: {"alter": [{"entity": {type: name|null}, "ops": {key: value|null}}],
    // "validate_only": bool, "describe": {"components": [{"type", "match": "exact"|"default"|"any",
    // "name"}], "strict": bool}} -> {"altered": [null | error class], "described": [{entity, values}]}

    private static Map<String, String> quotaEntityMap(Object entity) {
        Map<String, String> out = new HashMap<>();
        for (Map.Entry<String, Object> e : asMap(entity).entrySet()) {
            out.put(e.getKey(), e.getValue() == null ? null : String.valueOf(e.getValue()));
        }
        return out;
    }

    private static Object quotas(Admin admin, Map<String, Object> o) throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        if (o.get("alter") != null) {
            List<org.apache.kafka.common.quota.ClientQuotaAlteration> alterations = new ArrayList<>();
            for (Object a : (List<?>) o.get("alter")) {
                Map<String, Object> m = asMap(a);
                List<org.apache.kafka.common.quota.ClientQuotaAlteration.Op> ops = new ArrayList<>();
                for (Map.Entry<String, Object> op : asMap(m.get("ops")).entrySet()) {
                    Double value = op.getValue() == null ? null : ((Number) op.getValue()).doubleValue();
                    ops.add(new org.apache.kafka.common.quota.ClientQuotaAlteration.Op(op.getKey(), value));
                }
                alterations.add(new org.apache.kafka.common.quota.ClientQuotaAlteration(
                        new org.apache.kafka.common.quota.ClientQuotaEntity(quotaEntityMap(m.get("entity"))), ops));
            }
            org.apache.kafka.clients.admin.AlterClientQuotasOptions options =
                    new org.apache.kafka.clients.admin.AlterClientQuotasOptions()
                            .validateOnly(Boolean.TRUE.equals(o.get("validate_only")));
            Map<org.apache.kafka.common.quota.ClientQuotaEntity, KafkaFuture<Void>> values =
                    admin.alterClientQuotas(alterations, options).values();
            List<Object> altered = new ArrayList<>();
            for (org.apache.kafka.common.quota.ClientQuotaAlteration a : alterations) {
                try {
                    values.get(a.entity()).get();
                    altered.add(null);
                } catch (ExecutionException e) {
                    altered.add(e.getCause().getClass().getSimpleName() + ": " + e.getCause().getMessage());
                }
            }
            out.put("altered", altered);
        }
        if (o.get("describe") != null) {
            Map<String, Object> d = asMap(o.get("describe"));
            List<org.apache.kafka.common.quota.ClientQuotaFilterComponent> components = new ArrayList<>();
            for (Object c : (List<?>) d.getOrDefault("components", List.of())) {
                Map<String, Object> m = asMap(c);
                String type = str(m, "type");
                switch (String.valueOf(m.get("match"))) {
                    case "exact": components.add(org.apache.kafka.common.quota.ClientQuotaFilterComponent.ofEntity(type, str(m, "name"))); break;
                    case "default": components.add(org.apache.kafka.common.quota.ClientQuotaFilterComponent.ofDefaultEntity(type)); break;
                    default: components.add(org.apache.kafka.common.quota.ClientQuotaFilterComponent.ofEntityType(type)); break;
                }
            }
            org.apache.kafka.common.quota.ClientQuotaFilter filter = Boolean.TRUE.equals(d.get("strict"))
                    ? org.apache.kafka.common.quota.ClientQuotaFilter.containsOnly(components)
                    : org.apache.kafka.common.quota.ClientQuotaFilter.contains(components);
            try {
                List<Object> described = new ArrayList<>();
                for (Map.Entry<org.apache.kafka.common.quota.ClientQuotaEntity, Map<String, Double>> e :
                        admin.describeClientQuotas(filter).entities().get().entrySet()) {
                    Map<String, Object> entry = new LinkedHashMap<>();
                    entry.put("entity", new TreeMap<>(e.getKey().entries()));
                    entry.put("values", new TreeMap<>(e.getValue()));
                    described.add(entry);
                }
                out.put("described", described);
            } catch (ExecutionException e) {
                out.put("described", Map.of("error", e.getCause().getClass().getSimpleName(),
                        "message", String.valueOf(e.getCause().getMessage())));
            }
        }
        return out;
    }

    private static Object acls(Admin admin, Map<String, Object> o) throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        if (o.get("create") != null) {
            List<AclBinding> bindings = new ArrayList<>();
            for (Object b : (List<?>) o.get("create")) bindings.add(aclBinding(asMap(b)));
            Map<AclBinding, KafkaFuture<Void>> values = admin.createAcls(bindings).values();
            List<Object> created = new ArrayList<>();
            for (AclBinding b : bindings) {
                try {
                    values.get(b).get();
                    created.add(null);
                } catch (ExecutionException e) {
                    created.add(e.getCause().getClass().getSimpleName());
                }
            }
            out.put("created", created);
        }
        if (o.get("describe") != null) {
            try {
                List<Object> described = new ArrayList<>();
                for (AclBinding b : admin.describeAcls(aclFilter(asMap(o.get("describe")))).values().get()) {
                    described.add(aclJson(b));
                }
                out.put("described", described);
            } catch (ExecutionException e) {
                out.put("described", Map.of("error", e.getCause().getClass().getSimpleName()));
            }
        }
        if (o.get("delete") != null) {
            List<AclBindingFilter> filters = new ArrayList<>();
            for (Object f : (List<?>) o.get("delete")) filters.add(aclFilter(asMap(f)));
            Map<AclBindingFilter, KafkaFuture<DeleteAclsResult.FilterResults>> values =
                    admin.deleteAcls(filters).values();
            List<Object> deleted = new ArrayList<>();
            for (AclBindingFilter f : filters) {
                try {
                    List<Object> acls = new ArrayList<>();
                    for (DeleteAclsResult.FilterResult r : values.get(f).get().values()) {
                        acls.add(r.exception() == null ? aclJson(r.binding())
                                : Map.of("error", r.exception().getClass().getSimpleName()));
                    }
                    deleted.add(acls);
                } catch (ExecutionException e) {
                    deleted.add(Map.of("error", e.getCause().getClass().getSimpleName()));
                }
            }
            out.put("deleted", deleted);
        }
        return out;
    }

    private static AclBinding aclBinding(Map<String, Object> a) {
        return new AclBinding(
                new ResourcePattern(ResourceType.valueOf(str(a, "resource_type")), str(a, "name"),
                        PatternType.valueOf(str(a, "pattern"))),
                new AccessControlEntry(str(a, "principal"), str(a, "host"),
                        AclOperation.valueOf(str(a, "operation")),
                        AclPermissionType.valueOf(str(a, "permission"))));
    }

    private static AclBindingFilter aclFilter(Map<String, Object> f) {
        return new AclBindingFilter(
                new ResourcePatternFilter(ResourceType.valueOf(str(f, "resource_type")),
                        (String) f.get("name"), PatternType.valueOf(str(f, "pattern"))),
                new AccessControlEntryFilter((String) f.get("principal"), (String) f.get("host"),
                        AclOperation.valueOf(str(f, "operation")),
                        AclPermissionType.valueOf(str(f, "permission"))));
    }

    private static Map<String, Object> aclJson(AclBinding b) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("resource_type", b.pattern().resourceType().name());
        m.put("name", b.pattern().name());
        m.put("pattern", b.pattern().patternType().name());
        m.put("principal", b.entry().principal());
        m.put("host", b.entry().host());
        m.put("operation", b.entry().operation().name());
        m.put("permission", b.entry().permissionType().name());
        return m;
    }

    private static Object listTopics(Admin admin) throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("topics", new ArrayList<>(new java.util.TreeSet<>(admin.listTopics().names().get())));
        return out;
    }

    private static Map<String, Object> describeTopic(Admin admin, String name) throws Exception {
        TopicDescription d = admin.describeTopics(List.of(name)).allTopicNames().get().get(name);
        List<Object> parts = new ArrayList<>();
        for (TopicPartitionInfo pi : d.partitions()) {
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("partition", pi.partition());
            m.put("leader", pi.leader() == null ? null : pi.leader().id());
            List<Object> replicas = new ArrayList<>();
            for (Node n : pi.replicas()) replicas.add(n.id());
            List<Object> isr = new ArrayList<>();
            for (Node n : pi.isr()) isr.add(n.id());
            m.put("replicas", replicas);
            m.put("isr", isr);
            parts.add(m);
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("name", d.name());
        out.put("partitions", parts);
        return out;
    }

    /** The resource a configs command names: {"broker": id} (a BROKER resource), else {"topic"}. */
    private static ConfigResource configResource(Map<String, Object> o) {
        if (o.containsKey("broker")) return new ConfigResource(ConfigResource.Type.BROKER, str(o, "broker"));
        return new ConfigResource(ConfigResource.Type.TOPIC, str(o, "topic"));
    }

    private static Object describeConfigs(Admin admin, Map<String, Object> o) throws Exception {
        ConfigResource res = configResource(o);
        Config config = admin.describeConfigs(List.of(res)).all().get().get(res);
        Map<String, Object> cfg = new TreeMap<>();
        for (ConfigEntry e : config.entries()) cfg.put(e.name(), e.value());
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("configs", cfg);
        return out;
    }

    private static Object alterConfigs(Admin admin, Map<String, Object> o) throws Exception {
        ConfigResource res = configResource(o);
        List<AlterConfigOp> ops = new ArrayList<>();
        if (o.get("set") != null) {
            for (Map.Entry<String, Object> e : asMap(o.get("set")).entrySet()) {
                ops.add(new AlterConfigOp(new ConfigEntry(e.getKey(), String.valueOf(e.getValue())),
                        AlterConfigOp.OpType.SET));
            }
        }
        if (o.get("delete") != null) {
            for (Object name : (List<?>) o.get("delete")) {
                ops.add(new AlterConfigOp(new ConfigEntry((String) name, null), AlterConfigOp.OpType.DELETE));
            }
        }
        Map<ConfigResource, Collection<AlterConfigOp>> req = new HashMap<>();
        req.put(res, ops);
        admin.incrementalAlterConfigs(req).all().get();
        return new LinkedHashMap<>();
    }

    private static Object createPartitions(Admin admin, Map<String, Object> o) throws Exception {
        int total = ((Number) o.get("total")).intValue();
        admin.createPartitions(Map.of(str(o, "topic"), NewPartitions.increaseTo(total))).all().get();
        return new LinkedHashMap<>();
    }

    private static Object deleteTopic(Admin admin, Map<String, Object> o) throws Exception {
        admin.deleteTopics(List.of(str(o, "topic"))).all().get();
        return new LinkedHashMap<>();
    }

    private static Object listOffsets(Admin admin, Map<String, Object> o) throws Exception {
        String topic = str(o, "topic");
        String spec = str(o, "spec");
        OffsetSpec offsetSpec;
        switch (spec) {
            case "earliest": offsetSpec = OffsetSpec.earliest(); break;
            case "latest": offsetSpec = OffsetSpec.latest(); break;
            case "max-timestamp": offsetSpec = OffsetSpec.maxTimestamp(); break;
            case "timestamp": offsetSpec = OffsetSpec.forTimestamp(((Number) o.get("timestamp")).longValue()); break;
            default: throw new IllegalArgumentException("unknown spec " + spec);
        }
        Map<TopicPartition, OffsetSpec> req = new HashMap<>();
        for (Object n : (List<?>) o.get("partitions")) req.put(new TopicPartition(topic, ((Number) n).intValue()), offsetSpec);
        Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> got = admin.listOffsets(req).all().get();
        Map<String, Object> out = new TreeMap<>();
        for (Map.Entry<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> e : got.entrySet()) {
            Map<String, Object> one = new LinkedHashMap<>();
            one.put("offset", e.getValue().offset());
            one.put("timestamp", e.getValue().timestamp());
            out.put(String.valueOf(e.getKey().partition()), one);
        }
        return out;
    }

    // ---- helpers ----------------------------------------------------------------------------

    private static Properties base(Map<String, Object> o) {
        Properties p = new Properties();
        p.put("bootstrap.servers", str(o, "bootstrap"));
        p.put("client.id", "tidelog-interop-java");
        return p;
    }

    private static void putAll(Properties p, Object configs) {
        if (configs == null) return;
        for (Map.Entry<String, Object> e : asMap(configs).entrySet()) p.put(e.getKey(), String.valueOf(e.getValue()));
    }

    private static String str(Map<String, Object> o, String name) {
        Object v = o.get(name);
        if (v == null) throw new IllegalArgumentException("missing option " + name);
        return String.valueOf(v);
    }

    @SuppressWarnings("unchecked")
    private static Map<String, Object> asMap(Object v) {
        return (Map<String, Object>) v;
    }

    private static byte[] bytes(Object b64) {
        return b64 == null ? null : B64D.decode((String) b64);
    }

    private static String b64(byte[] data) {
        return data == null ? null : B64E.encodeToString(data);
    }

    /** Just enough JSON for this harness: objects, arrays, strings, integers, booleans, null. */
    static final class Json {
        private final String s;
        private int i;

        private Json(String s) {
            this.s = s;
        }

        static Object parse(String text) {
            Json j = new Json(text);
            Object v = j.value();
            j.ws();
            if (j.i != j.s.length()) throw new IllegalArgumentException("trailing JSON at " + j.i);
            return v;
        }

        private void ws() {
            while (i < s.length() && Character.isWhitespace(s.charAt(i))) i++;
        }

        private Object value() {
            ws();
            char c = s.charAt(i);
            if (c == '{') {
                i++;
                Map<String, Object> m = new LinkedHashMap<>();
                ws();
                if (s.charAt(i) == '}') { i++; return m; }
                while (true) {
                    ws();
                    String k = string();
                    ws();
                    expect(':');
                    m.put(k, value());
                    ws();
                    if (s.charAt(i) == ',') { i++; continue; }
                    expect('}');
                    return m;
                }
            }
            if (c == '[') {
                i++;
                List<Object> l = new ArrayList<>();
                ws();
                if (s.charAt(i) == ']') { i++; return l; }
                while (true) {
                    l.add(value());
                    ws();
                    if (s.charAt(i) == ',') { i++; continue; }
                    expect(']');
                    return l;
                }
            }
            if (c == '"') return string();
            if (s.startsWith("null", i)) { i += 4; return null; }
            if (s.startsWith("true", i)) { i += 4; return Boolean.TRUE; }
            if (s.startsWith("false", i)) { i += 5; return Boolean.FALSE; }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            String num = s.substring(start, i);
            if (num.isEmpty()) throw new IllegalArgumentException("bad JSON at " + start);
            if (num.contains(".") || num.contains("e") || num.contains("E")) return Double.parseDouble(num);
            return Long.parseLong(num);
        }

        private void expect(char c) {
            if (s.charAt(i) != c) throw new IllegalArgumentException("expected " + c + " at " + i);
            i++;
        }

        private String string() {
            expect('"');
            StringBuilder b = new StringBuilder();
            while (true) {
                char c = s.charAt(i++);
                if (c == '"') return b.toString();
                if (c != '\\') { b.append(c); continue; }
                char e = s.charAt(i++);
                switch (e) {
                    case 'n': b.append('\n'); break;
                    case 't': b.append('\t'); break;
                    case 'r': b.append('\r'); break;
                    case 'b': b.append('\b'); break;
                    case 'f': b.append('\f'); break;
                    case 'u': b.append((char) Integer.parseInt(s.substring(i, i + 4), 16)); i += 4; break;
                    default: b.append(e);
                }
            }
        }

        static String write(Object v) {
            StringBuilder b = new StringBuilder();
            write(b, v);
            return b.toString();
        }

        private static void write(StringBuilder b, Object v) {
            if (v == null) {
                b.append("null");
            } else if (v instanceof String) {
                String str = (String) v;
                b.append('"');
                for (int k = 0; k < str.length(); k++) {
                    char c = str.charAt(k);
                    if (c == '"' || c == '\\') b.append('\\').append(c);
                    else if (c < 0x20 || c > 0x7e) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
                }
                b.append('"');
            } else if (v instanceof Map) {
                b.append('{');
                boolean first = true;
                for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                    if (!first) b.append(',');
                    first = false;
                    write(b, String.valueOf(e.getKey()));
                    b.append(':');
                    write(b, e.getValue());
                }
                b.append('}');
            } else if (v instanceof Collection) {
                b.append('[');
                boolean first = true;
                for (Object x : (Collection<?>) v) {
                    if (!first) b.append(',');
                    first = false;
                    write(b, x);
                }
                b.append(']');
            } else {
                b.append(v);
            }
        }
    }

    private InteropClient() {}
}
