// W5 (consume) on Kafka, through the real kafka-clients 4.1 producer and consumer.
//
// The Rust harness (crates/tidemark-bench/src/w5_peers/kafka.rs) embeds this file, writes it
// out at run time and runs it with Java 17's single-file source launcher:
//
//   java -Xmx2g -cp '<kafka libs>/*' ConsumeBench.java <mode> <bootstrap> <args...>
//
// Modes (the broker, its topics and their partitions are set up by the harness):
//
//   latency <bootstrap> <topic> <partitions> <records/s> <record bytes> <warmup ms> <window ms>
//       One producer sends records on a fixed schedule, each to a random partition, while one
//       consumer follows every partition; latency = receipt - due time.
//   fill <bootstrap> <topic> <records> <record bytes>
//       Fills partition 0 of the topic as fast as the producer goes.
//   catchup <bootstrap> <topic> <consumers> <records>
//       `consumers` consumers, each its own KafkaConsumer (its own connections), read
//       partition 0 from its start to its end at once.
//   idle <bootstrap> <topic> <partitions> <subscriptions>
//       `subscriptions` consumers, each on a partition of an empty topic, each blocked in
//       poll on its own thread, until standard input closes.
//
// Output: progress lines (`READY`, `WINDOW`, `END`, `GO`) for the harness to time its
// sampling of the broker, and one final `RESULT key=value ...` line. Anything else on
// stdout (log4j's own default configuration logs errors there) is ignored. A failure exits
// non-zero with its reason on stderr.
//
// Client settings are kafka-clients' defaults except where a comment says otherwise; the
// producer's are those of the W3 Kafka runs (acks=all, linger.ms=0, a 64 KiB batch.size, so
// that one 64 KiB record is one batch, as one Tidemark append is one batch).

import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Properties;
import java.util.SplittableRandom;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.locks.LockSupport;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class ConsumeBench {
    /** How long the latency mode waits after its window for records still on their way. */
    static final long STRAGGLER_WAIT_NANOS = TimeUnit.SECONDS.toNanos(5);

    public static void main(String[] args) {
        if (args.length < 2) {
            fail("usage: ConsumeBench latency|fill|catchup|idle <bootstrap> <args...>");
        }
        String mode = args[0];
        String bootstrap = args[1];
        try {
            switch (mode) {
                case "latency" -> {
                    need(args, 8);
                    latency(bootstrap, args[2], intArg(args[3]), Double.parseDouble(args[4]),
                            intArg(args[5]), longArg(args[6]), longArg(args[7]));
                }
                case "fill" -> {
                    need(args, 5);
                    fill(bootstrap, args[2], longArg(args[3]), intArg(args[4]));
                }
                case "catchup" -> {
                    need(args, 5);
                    catchUp(bootstrap, args[2], intArg(args[3]), longArg(args[4]));
                }
                case "idle" -> {
                    need(args, 5);
                    idle(bootstrap, args[2], intArg(args[3]), intArg(args[4]));
                }
                default -> fail("unknown mode " + mode);
            }
        } catch (Throwable e) {
            e.printStackTrace();
            fail(mode + " failed: " + e);
        }
        // Exit without waiting for any thread a client may have left behind.
        System.exit(0);
    }

    // ---------------------------------------------------------------------------------
    // Clients

    /** The W3 Kafka producer: acks=all, no linger, one 64 KiB record per batch. */
    static KafkaProducer<byte[], byte[]> producer(String bootstrap, int recordBytes) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "0");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, Integer.toString(recordBytes));
        // As W3's runs (peers/kafka.rs, producer_props): room for several batches, and a
        // request for at least one whole record.
        p.put(ProducerConfig.BUFFER_MEMORY_CONFIG, Long.toString(Math.max(8L * recordBytes, 32L << 20)));
        p.put(ProducerConfig.MAX_REQUEST_SIZE_CONFIG, Integer.toString(Math.max(2 * recordBytes, 1 << 20)));
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        return new KafkaProducer<>(p);
    }

    /**
     * A consumer with kafka-clients' defaults (fetch.min.bytes=1, fetch.max.wait.ms=500,
     * max.partition.fetch.bytes=1 MiB, fetch.max.bytes=50 MiB): no group, since every
     * consumer here is given its partitions with assign() and commits nothing.
     */
    static KafkaConsumer<byte[], byte[]> consumer(String bootstrap, String clientId) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        return new KafkaConsumer<>(p);
    }

    static List<TopicPartition> partitions(String topic, int count) {
        List<TopicPartition> all = new ArrayList<>(count);
        for (int i = 0; i < count; i++) {
            all.add(new TopicPartition(topic, i));
        }
        return all;
    }

    /** Random capital letters, as ProducerPerformance's payload: not compressible to nothing. */
    static byte[] payloadPool(int bytes) {
        SplittableRandom random = new SplittableRandom(42);
        byte[] pool = new byte[bytes];
        for (int i = 0; i < bytes; i++) {
            pool[i] = (byte) ('A' + random.nextInt(26));
        }
        return pool;
    }

    /** Counts failed sends and keeps the first reason, for the result. */
    static final class SendErrors {
        final AtomicLong count = new AtomicLong();
        final AtomicReference<Exception> first = new AtomicReference<>();

        void record(Exception e) {
            if (e != null) {
                count.incrementAndGet();
                first.compareAndSet(null, e);
            }
        }

        void report() {
            Exception e = first.get();
            if (e != null) {
                System.err.println("first send error: " + e);
            }
        }
    }

    // ---------------------------------------------------------------------------------
    // Live latency

    static void latency(String bootstrap, String topic, int partitionCount, double recordsPerSecond,
                        int recordBytes, long warmupMs, long windowMs) throws Exception {
        if (recordsPerSecond <= 0 || recordBytes < 8 || partitionCount < 1) {
            fail("latency: bad arguments");
        }
        long intervalNanos = Math.max(1, Math.round(1e9 / recordsPerSecond));
        long warmupNanos = TimeUnit.MILLISECONDS.toNanos(warmupMs);
        long windowNanos = TimeUnit.MILLISECONDS.toNanos(windowMs);
        // Record i is due at start + i × interval; these are the ones due in the window.
        long firstInWindow = ceilDiv(warmupNanos, intervalNanos);
        long endOfWindow = ceilDiv(warmupNanos + windowNanos, intervalNanos);
        long inWindow = endOfWindow - firstInWindow;

        LatencyConsumer follower = new LatencyConsumer(bootstrap, topic, partitionCount,
                (int) Math.min(Integer.MAX_VALUE - 8, inWindow + 16));
        Thread consumerThread = new Thread(follower, "consumer");
        consumerThread.start();
        // The consumer is at the end of every partition before the first record is sent.
        if (!follower.ready.await(120, TimeUnit.SECONDS) || follower.failure.get() != null) {
            fail("the consumer did not get ready: " + follower.failure.get());
        }

        KafkaProducer<byte[], byte[]> producer = producer(bootstrap, recordBytes);
        // Metadata before the schedule starts, so the first send does not wait for it.
        producer.partitionsFor(topic);
        byte[] pool = payloadPool(2 * recordBytes);
        SplittableRandom random = new SplittableRandom();
        SendErrors errors = new SendErrors();

        long start = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(10);
        long windowStart = start + warmupNanos;
        long windowEnd = windowStart + windowNanos;
        follower.window(windowStart, windowEnd);
        Thread marker = markWindow(windowStart, windowEnd);

        // The schedule: record i is sent at its due time, or as soon as the producer can when
        // it is late (its latency then includes the wait). Nothing is sent after the window.
        long sent = 0;
        for (long i = 0; i < endOfWindow; i++) {
            long due = start + i * intervalNanos;
            long now;
            while ((now = System.nanoTime()) < due) {
                LockSupport.parkNanos(due - now);
            }
            if (now >= windowEnd) {
                break;
            }
            byte[] value = new byte[recordBytes];
            System.arraycopy(pool, random.nextInt(recordBytes), value, 0, recordBytes);
            ByteBuffer.wrap(value).putLong(due);
            int partition = random.nextInt(partitionCount);
            // Kafka's normal asynchronous send; the callback only counts failures.
            producer.send(new ProducerRecord<>(topic, partition, null, value),
                    (metadata, e) -> errors.record(e));
            sent = i + 1;
        }
        // Due in the window but not sent by its end: the schedule was more than the
        // producer (or the broker behind it) could do.
        long behind = endOfWindow - Math.max(sent, firstInWindow);
        long sentInWindow = Math.max(0, sent - firstInWindow);

        // Stragglers: until every record sent for the window arrived, or 5 s after it.
        long deadline = windowEnd + STRAGGLER_WAIT_NANOS;
        while (System.nanoTime() < deadline
                && follower.receivedDueInWindow() < sentInWindow - errors.count.get()
                && follower.failure.get() == null) {
            Thread.sleep(5);
        }
        follower.stop.set(true);
        consumerThread.join();
        marker.join();
        producer.close(Duration.ofSeconds(10));
        if (follower.failure.get() != null) {
            fail("the consumer failed: " + follower.failure.get());
        }
        errors.report();

        long[] latencies = follower.latencies();
        Arrays.sort(latencies);
        long sum = 0;
        for (long l : latencies) {
            sum += l;
        }
        int n = latencies.length;
        StringBuilder result = new StringBuilder("RESULT");
        result.append(" sent=").append(sent)
                .append(" sent_in_window=").append(sentInWindow)
                .append(" behind=").append(behind)
                .append(" send_errors=").append(errors.count.get())
                .append(" count=").append(n)
                .append(" missing=").append(sentInWindow - errors.count.get() - n)
                .append(" delivered_bytes=").append(follower.bytesInWindow())
                .append(" window_ns=").append(windowNanos);
        if (n > 0) {
            result.append(" avg_ns=").append(sum / n)
                    .append(" p50_ns=").append(percentile(latencies, 0.50))
                    .append(" p95_ns=").append(percentile(latencies, 0.95))
                    .append(" p99_ns=").append(percentile(latencies, 0.99))
                    .append(" p999_ns=").append(percentile(latencies, 0.999))
                    .append(" max_ns=").append(latencies[n - 1]);
        }
        System.out.println(result);
    }

    /** Prints WINDOW and END at the window's edges, for the harness's sampling of the broker. */
    static Thread markWindow(long windowStart, long windowEnd) {
        Thread marker = new Thread(() -> {
            sleepUntil(windowStart);
            System.out.println("WINDOW");
            sleepUntil(windowEnd);
            System.out.println("END");
        }, "window-marker");
        marker.setDaemon(true);
        marker.start();
        return marker;
    }

    /** The one consumer of the latency mode, following every partition of the topic. */
    static final class LatencyConsumer implements Runnable {
        final String bootstrap;
        final String topic;
        final int partitionCount;
        final CountDownLatch ready = new CountDownLatch(1);
        final AtomicBoolean stop = new AtomicBoolean();
        final AtomicReference<Throwable> failure = new AtomicReference<>();
        /** Records due in the window that arrived; read by the producer's thread. */
        final AtomicLong dueInWindow = new AtomicLong();
        final AtomicLong bytesInWindow = new AtomicLong();
        // Set by window() before the first record is sent; the consumer reads them only
        // for records, which are sent after it (the send publishes them to this thread).
        volatile long windowStart;
        volatile long windowEnd;
        long[] latencies;
        volatile int recorded;

        LatencyConsumer(String bootstrap, String topic, int partitionCount, int capacity) {
            this.bootstrap = bootstrap;
            this.topic = topic;
            this.partitionCount = partitionCount;
            this.latencies = new long[Math.max(16, capacity)];
        }

        void window(long start, long end) {
            windowStart = start;
            windowEnd = end;
        }

        long receivedDueInWindow() {
            return dueInWindow.get();
        }

        long bytesInWindow() {
            return bytesInWindow.get();
        }

        /** After the consumer's thread ended (join publishes its writes). */
        long[] latencies() {
            return Arrays.copyOf(latencies, recorded);
        }

        @Override
        public void run() {
            try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap, "w5-latency")) {
                List<TopicPartition> all = partitions(topic, partitionCount);
                consumer.assign(all);
                consumer.seekToEnd(all);
                // seekToEnd is lazy: position() looks the ends up now, not at the first poll.
                for (TopicPartition tp : all) {
                    consumer.position(tp, Duration.ofSeconds(60));
                }
                ready.countDown();
                while (!stop.get()) {
                    ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(100));
                    // Every record of one poll was received when the poll returned.
                    long received = System.nanoTime();
                    for (ConsumerRecord<byte[], byte[]> record : records) {
                        byte[] value = record.value();
                        long due = ByteBuffer.wrap(value).getLong();
                        if (received >= windowStart && received < windowEnd) {
                            bytesInWindow.addAndGet(value.length);
                        }
                        if (due >= windowStart && due < windowEnd) {
                            if (recorded == latencies.length) {
                                latencies = Arrays.copyOf(latencies, latencies.length * 2);
                            }
                            latencies[recorded] = received - due;
                            recorded = recorded + 1;
                            dueInWindow.incrementAndGet();
                        }
                    }
                }
            } catch (Throwable e) {
                failure.compareAndSet(null, e);
            } finally {
                ready.countDown();
            }
        }
    }

    /** The nearest-rank percentile of sorted values. */
    static long percentile(long[] sorted, double q) {
        int rank = (int) Math.ceil(q * sorted.length);
        return sorted[Math.max(0, Math.min(sorted.length - 1, rank - 1))];
    }

    // ---------------------------------------------------------------------------------
    // Catch-up

    /** Fills partition 0 with `records` records as fast as the producer goes (5 in flight). */
    static void fill(String bootstrap, String topic, long records, int recordBytes) throws Exception {
        byte[] pool = payloadPool(2 * recordBytes);
        SplittableRandom random = new SplittableRandom();
        SendErrors errors = new SendErrors();
        long started = System.nanoTime();
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap, recordBytes)) {
            for (long i = 0; i < records; i++) {
                byte[] value = new byte[recordBytes];
                System.arraycopy(pool, random.nextInt(recordBytes), value, 0, recordBytes);
                producer.send(new ProducerRecord<>(topic, 0, null, value), (m, e) -> errors.record(e));
            }
            producer.flush();
        }
        errors.report();
        if (errors.count.get() > 0) {
            fail(errors.count.get() + " of " + records + " sends failed");
        }
        double seconds = (System.nanoTime() - started) / 1e9;
        System.out.println("RESULT records=" + records + " seconds=" + seconds);
    }

    /**
     * `consumers` consumers read partition 0 from its start to its end at once. Each is
     * created, assigned, sought to the beginning and connected (position() asks the broker)
     * before the clock starts; the clock stops when the last one has read every record.
     */
    static void catchUp(String bootstrap, String topic, int consumerCount, long records) throws Exception {
        TopicPartition tp = new TopicPartition(topic, 0);
        List<KafkaConsumer<byte[], byte[]>> consumers = new ArrayList<>(consumerCount);
        try {
            for (int i = 0; i < consumerCount; i++) {
                KafkaConsumer<byte[], byte[]> c = consumer(bootstrap, "w5-catchup-" + i);
                consumers.add(c);
                c.assign(Collections.singletonList(tp));
                c.seekToBeginning(Collections.singletonList(tp));
                if (c.position(tp, Duration.ofSeconds(60)) != 0) {
                    fail("the stream does not start at offset 0");
                }
            }
            long end = consumers.get(0).endOffsets(Collections.singletonList(tp)).get(tp);
            if (end != records) {
                fail("the stream holds " + end + " records, not " + records);
            }

            CountDownLatch go = new CountDownLatch(1);
            CountDownLatch done = new CountDownLatch(consumerCount);
            AtomicReference<Throwable> failure = new AtomicReference<>();
            AtomicLong bytes = new AtomicLong();
            AtomicLong read = new AtomicLong();
            List<Thread> threads = new ArrayList<>();
            for (KafkaConsumer<byte[], byte[]> c : consumers) {
                // Each consumer is used by its own thread only (KafkaConsumer is not
                // thread-safe); the start latch hands it over.
                Thread t = new Thread(() -> {
                    try {
                        go.await();
                        long mine = 0;
                        long myBytes = 0;
                        while (mine < records && failure.get() == null) {
                            for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(100))) {
                                mine++;
                                myBytes += r.value().length;
                            }
                        }
                        read.addAndGet(mine);
                        bytes.addAndGet(myBytes);
                    } catch (Throwable e) {
                        failure.compareAndSet(null, e);
                    } finally {
                        done.countDown();
                    }
                });
                threads.add(t);
                t.start();
            }
            System.out.println("GO");
            long started = System.nanoTime();
            go.countDown();
            done.await();
            long finished = System.nanoTime();
            for (Thread t : threads) {
                t.join();
            }
            if (failure.get() != null) {
                fail("a consumer failed: " + failure.get());
            }
            if (read.get() != records * consumerCount) {
                fail("read " + read.get() + " records, not " + records * consumerCount);
            }
            System.out.println("RESULT consumers=" + consumerCount + " records=" + read.get()
                    + " bytes=" + bytes.get() + " seconds=" + (finished - started) / 1e9);
        } finally {
            for (KafkaConsumer<byte[], byte[]> c : consumers) {
                c.close();
            }
        }
    }

    // ---------------------------------------------------------------------------------
    // Idle subscriptions

    /**
     * `count` consumers, consumer i on partition i % partitions, each with its own thread
     * blocked in poll: what an idle Kafka follower is (its fetch waits in the broker for
     * fetch.max.wait.ms, 500 ms, then it asks again). READY once every one is connected and
     * polling; everything closes when standard input does.
     */
    static void idle(String bootstrap, String topic, int partitionCount, int count) throws Exception {
        List<KafkaConsumer<byte[], byte[]>> consumers = new ArrayList<>(count);
        List<Thread> threads = new ArrayList<>(count);
        AtomicBoolean stop = new AtomicBoolean();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        AtomicLong unexpected = new AtomicLong();
        CountDownLatch polling = new CountDownLatch(count);
        try {
            for (int i = 0; i < count; i++) {
                KafkaConsumer<byte[], byte[]> c = consumer(bootstrap, "w5-idle-" + i);
                consumers.add(c);
                TopicPartition tp = new TopicPartition(topic, i % partitionCount);
                c.assign(Collections.singletonList(tp));
                c.seekToEnd(Collections.singletonList(tp));
                // Connects and looks the end up before the consumer counts as subscribed.
                c.position(tp, Duration.ofSeconds(60));
                Thread t = new Thread(() -> {
                    polling.countDown();
                    try {
                        while (!stop.get()) {
                            unexpected.addAndGet(c.poll(Duration.ofSeconds(10)).count());
                        }
                    } catch (WakeupException e) {
                        // close() below: the end.
                    } catch (Throwable e) {
                        failure.compareAndSet(null, e);
                    }
                }, "idle-" + i);
                threads.add(t);
                t.start();
            }
            polling.await();
            System.out.println("READY " + count);
            // Wait for the harness: it measures the broker, then closes our standard input.
            while (System.in.read() >= 0) {
                // Nothing is expected on standard input; only its end.
            }
        } finally {
            stop.set(true);
            for (KafkaConsumer<byte[], byte[]> c : consumers) {
                c.wakeup();
            }
            for (Thread t : threads) {
                t.join();
            }
            for (KafkaConsumer<byte[], byte[]> c : consumers) {
                c.close();
            }
        }
        if (failure.get() != null) {
            fail("a consumer failed: " + failure.get());
        }
        System.out.println("RESULT subscriptions=" + count + " unexpected_records=" + unexpected.get());
    }

    // ---------------------------------------------------------------------------------
    // Small things

    static void sleepUntil(long deadline) {
        long now;
        while ((now = System.nanoTime()) < deadline) {
            LockSupport.parkNanos(deadline - now);
        }
    }

    static long ceilDiv(long a, long b) {
        return (a + b - 1) / b;
    }

    static void need(String[] args, int count) {
        if (args.length != count) {
            fail(args[0] + ": expected " + (count - 1) + " arguments, got " + (args.length - 1));
        }
    }

    static int intArg(String text) {
        return Integer.parseInt(text);
    }

    static long longArg(String text) {
        return Long.parseLong(text);
    }

    static void fail(String reason) {
        System.err.println("ConsumeBench: " + reason);
        System.err.flush();
        System.exit(1);
    }
}
