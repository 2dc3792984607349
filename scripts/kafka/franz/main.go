// franz-compat: the compatibility run's franz-go client (scripts/compat).
//
// It creates a topic with kadm, checks what Metadata says of it, produces records with an
// idempotent producer (franz-go's default: acks=all, several requests in flight per broker,
// snappy batches) to chosen partitions, lists the partitions' offsets, and reads everything
// back by direct partition consumption (no consumer group: Biplane serves none yet). It
// checks count, order per partition, offsets, keys, values and headers, and exits 1 with
// the first mismatch named. One line per check goes to stdout: "ok <check>: <detail>".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

type settings struct {
	brokers    []string
	topic      string
	partitions int32
	replicas   int16
	records    int
	timeout    time.Duration
}

func main() {
	var s settings
	brokers := flag.String("brokers", "", "bootstrap servers, comma separated (host:port)")
	flag.StringVar(&s.topic, "topic", "franz", "topic to create, write and read")
	partitions := flag.Int("partitions", 4, "partitions of the topic")
	replicas := flag.Int("replication-factor", 3, "replication factor of the topic")
	flag.IntVar(&s.records, "records", 4000, "records to produce, spread over the partitions")
	flag.DurationVar(&s.timeout, "timeout", 60*time.Second, "time allowed for the whole run")
	flag.Parse()
	if *brokers == "" {
		fail("setup", errors.New("-brokers is required, e.g. -brokers 127.0.0.1:9092"))
	}
	if *partitions < 1 || *replicas < 1 || s.records < *partitions {
		fail("setup", fmt.Errorf("need partitions >= 1, replication-factor >= 1 and records >= partitions "+
			"(got %d, %d, %d)", *partitions, *replicas, s.records))
	}
	s.brokers = strings.Split(*brokers, ",")
	s.partitions = int32(*partitions)
	s.replicas = int16(*replicas)

	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	if err := run(ctx, s); err != nil {
		fail("run", err)
	}
}

func fail(step string, err error) {
	fmt.Fprintf(os.Stderr, "franz-compat: %s: %v\n", step, err)
	os.Exit(1)
}

func ok(check, format string, args ...any) {
	fmt.Printf("ok %s: %s\n", check, fmt.Sprintf(format, args...))
}

// value is what record seq of partition p carries, so a record read back names where it belongs.
func value(p int32, seq int) string { return fmt.Sprintf("franz p%d seq%06d", p, seq) }

func run(ctx context.Context, s settings) error {
	admin, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...))
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)

	retention := "3600000"
	created, err := adm.CreateTopic(ctx, s.partitions, s.replicas, map[string]*string{"retention.ms": &retention}, s.topic)
	if err != nil {
		return fmt.Errorf("kadm CreateTopic %q (%d partitions, rf %d): %w", s.topic, s.partitions, s.replicas, err)
	}

	metadata, err := checkMetadata(ctx, adm, s)
	if err != nil {
		return err
	}
	if err := checkConfig(ctx, adm, s, retention); err != nil {
		return err
	}
	ok("kadm-create", "topic %s, %d partitions, rf %d, retention.ms=%s read back with DescribeTopicConfigs",
		created.Topic, s.partitions, s.replicas, retention)
	ok("kadm-metadata", "%s", metadata)

	// Per partition, the offsets the broker acknowledged, in acknowledgement order.
	acked, err := produce(ctx, s)
	if err != nil {
		return err
	}

	if err := checkOffsets(ctx, adm, s, acked); err != nil {
		return err
	}
	if err := consume(ctx, s, acked); err != nil {
		return err
	}

	deleted, err := adm.DeleteTopic(ctx, s.topic)
	if err == nil {
		err = deleted.Err
	}
	if err != nil {
		return fmt.Errorf("kadm DeleteTopic %q: %w", s.topic, err)
	}
	ok("kadm-delete", "topic %s", s.topic)
	return nil
}

// checkMetadata waits until every partition has a leader (a new topic's leaders are elected
// shortly after CreateTopics answers) and checks the partition count and replica sets.
func checkMetadata(ctx context.Context, adm *kadm.Client, s settings) (string, error) {
	for {
		md, err := adm.Metadata(ctx, s.topic)
		if err != nil {
			return "", fmt.Errorf("kadm Metadata: %w", err)
		}
		detail := md.Topics[s.topic]
		problem := ""
		switch {
		case detail.Err != nil:
			problem = detail.Err.Error()
		case int32(len(detail.Partitions)) != s.partitions:
			problem = fmt.Sprintf("%d partitions, want %d", len(detail.Partitions), s.partitions)
		default:
			for _, p := range detail.Partitions.Sorted() {
				if p.Err != nil || p.Leader < 0 {
					problem = fmt.Sprintf("partition %d: leader %d, error %v", p.Partition, p.Leader, p.Err)
					break
				}
				if len(p.Replicas) != int(s.replicas) || !contains(p.Replicas, p.Leader) {
					return "", fmt.Errorf("metadata of %s-%d: replicas %v, leader %d: want %d replicas including the leader",
						s.topic, p.Partition, p.Replicas, p.Leader, s.replicas)
				}
			}
		}
		if problem == "" {
			return fmt.Sprintf("%d brokers, controller %d, %d partitions led", len(md.Brokers), md.Controller,
				len(detail.Partitions)), nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("metadata of %s not ready before the deadline: %s", s.topic, problem)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// checkConfig reads the topic's retention.ms back (CreateTopics answers counts and configs only
// from v5). The broker asked may learn of the new topic a moment after the one that created it,
// so UNKNOWN_TOPIC_OR_PARTITION is asked again until the deadline, as a client would.
func checkConfig(ctx context.Context, adm *kadm.Client, s settings, retention string) error {
	for {
		described, err := adm.DescribeTopicConfigs(ctx, s.topic)
		var config kadm.ResourceConfig
		if err == nil {
			config, err = described.On(s.topic, nil)
		}
		if err == nil {
			err = config.Err
		}
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			select {
			case <-ctx.Done():
				return fmt.Errorf("kadm DescribeTopicConfigs %q: %w until the deadline", s.topic, err)
			case <-time.After(200 * time.Millisecond):
				continue
			}
		}
		if err != nil {
			return fmt.Errorf("kadm DescribeTopicConfigs %q: %w", s.topic, err)
		}
		found := ""
		for _, c := range config.Configs {
			if c.Key == "retention.ms" {
				found = c.MaybeValue() + " (" + c.Source.String() + ")"
			}
		}
		if want := retention + " (DYNAMIC_TOPIC_CONFIG)"; found != want {
			return fmt.Errorf("topic %s: retention.ms is %q, want %s", s.topic, found, want)
		}
		return nil
	}
}

func contains(ids []int32, id int32) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func produce(ctx context.Context, s settings) (map[int32][]int64, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(s.brokers...),
		kgo.DefaultProduceTopic(s.topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// Small batches, so many produce requests are in flight at once and the idempotent
		// sequence numbers of several batches per partition are checked by the broker.
		kgo.ProducerBatchMaxBytes(16*1024),
		kgo.ProducerLinger(0),
	)
	if err != nil {
		return nil, fmt.Errorf("producer client: %w", err)
	}
	defer cl.Close()

	type ack struct {
		partition int32
		seq       int
		offset    int64
		err       error
	}
	acks := make(chan ack, s.records)
	for i := 0; i < s.records; i++ {
		p := int32(i) % s.partitions
		seq := i / int(s.partitions)
		r := &kgo.Record{
			Partition: p,
			Key:       []byte(fmt.Sprintf("key-%d", seq)),
			Value:     []byte(value(p, seq)),
			Headers:   []kgo.RecordHeader{{Key: "seq", Value: []byte(fmt.Sprint(seq))}},
		}
		cl.Produce(ctx, r, func(r *kgo.Record, err error) {
			acks <- ack{partition: r.Partition, seq: seq, offset: r.Offset, err: err}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return nil, fmt.Errorf("flush: %w", err)
	}
	acked := map[int32][]int64{}
	seqs := map[int32][]int{}
	for i := 0; i < s.records; i++ {
		a := <-acks
		if a.err != nil {
			return nil, fmt.Errorf("produce %s-%d seq %d: %w", s.topic, a.partition, a.seq, a.err)
		}
		acked[a.partition] = append(acked[a.partition], a.offset)
		seqs[a.partition] = append(seqs[a.partition], a.seq)
	}
	// franz-go calls a partition's promises in order: offsets must rise with the sequence.
	for p, offsets := range acked {
		for i := range offsets {
			if seqs[p][i] != i {
				return nil, fmt.Errorf("produce %s-%d: acknowledgement %d is for seq %d", s.topic, p, i, seqs[p][i])
			}
			if i > 0 && offsets[i] <= offsets[i-1] {
				return nil, fmt.Errorf("produce %s-%d: seq %d got offset %d after seq %d's %d", s.topic, p, i,
					offsets[i], i-1, offsets[i-1])
			}
		}
	}
	ok("produce", "%d records to %d partitions, idempotent, acks=all", s.records, len(acked))
	return acked, nil
}

func checkOffsets(ctx context.Context, adm *kadm.Client, s settings, acked map[int32][]int64) error {
	ends, err := adm.ListEndOffsets(ctx, s.topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("kadm ListEndOffsets: %w", err)
	}
	starts, err := adm.ListStartOffsets(ctx, s.topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fmt.Errorf("kadm ListStartOffsets: %w", err)
	}
	for p, offsets := range acked {
		end, found := ends.Lookup(s.topic, p)
		last := offsets[len(offsets)-1]
		if !found || end.Offset != last+1 {
			return fmt.Errorf("end offset of %s-%d: %d (found %v), want the last acknowledged offset %d + 1",
				s.topic, p, end.Offset, found, last)
		}
		start, found := starts.Lookup(s.topic, p)
		if !found || start.Offset < 0 || start.Offset > offsets[0] {
			return fmt.Errorf("start offset of %s-%d: %d (found %v), want 0..%d (the first acknowledged offset)",
				s.topic, p, start.Offset, found, offsets[0])
		}
	}
	ok("kadm-list-offsets", "end offsets follow the acknowledged ones on %d partitions", len(acked))
	return nil
}

func consume(ctx context.Context, s settings, acked map[int32][]int64) error {
	from := map[int32]kgo.Offset{}
	for p := int32(0); p < s.partitions; p++ {
		from[p] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(s.brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.topic: from}),
	)
	if err != nil {
		return fmt.Errorf("consumer client: %w", err)
	}
	defer cl.Close()

	read := map[int32]int{}
	total := 0
	for total < s.records {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("consume: %d of %d records read before the deadline (per partition: %v)",
				total, s.records, read)
		}
		var fetchErr error
		fetches.EachError(func(t string, p int32, err error) {
			fetchErr = fmt.Errorf("fetch %s-%d: %w", t, p, err)
		})
		if fetchErr != nil {
			return fetchErr
		}
		var bad error
		fetches.EachRecord(func(r *kgo.Record) {
			if bad != nil {
				return
			}
			seq := read[r.Partition]
			offsets := acked[r.Partition]
			switch {
			case seq >= len(offsets):
				bad = fmt.Errorf("%s-%d: an extra record at offset %d: %q", r.Topic, r.Partition, r.Offset, r.Value)
			case r.Offset != offsets[seq]:
				bad = fmt.Errorf("%s-%d: record %d at offset %d, acknowledged at %d", r.Topic, r.Partition, seq,
					r.Offset, offsets[seq])
			case string(r.Value) != value(r.Partition, seq):
				bad = fmt.Errorf("%s-%d offset %d: value %q, want %q", r.Topic, r.Partition, r.Offset, r.Value,
					value(r.Partition, seq))
			case string(r.Key) != fmt.Sprintf("key-%d", seq):
				bad = fmt.Errorf("%s-%d offset %d: key %q, want key-%d", r.Topic, r.Partition, r.Offset, r.Key, seq)
			case len(r.Headers) != 1 || r.Headers[0].Key != "seq" || string(r.Headers[0].Value) != fmt.Sprint(seq):
				bad = fmt.Errorf("%s-%d offset %d: headers %v, want [seq=%d]", r.Topic, r.Partition, r.Offset,
					r.Headers, seq)
			}
			read[r.Partition]++
			total++
		})
		if bad != nil {
			return fmt.Errorf("consume: %w", bad)
		}
	}
	parts := make([]string, 0, len(read))
	for p, n := range read {
		if n != len(acked[p]) {
			return fmt.Errorf("consume %s-%d: %d records read, %d acknowledged", s.topic, p, n, len(acked[p]))
		}
		parts = append(parts, fmt.Sprintf("p%d=%d", p, n))
	}
	sort.Strings(parts)
	ok("consume", "%d records read back in order by partition (%s)", total, strings.Join(parts, " "))
	return nil
}
