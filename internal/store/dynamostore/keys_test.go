package dynamostore

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/go-cmp/cmp"
)

func TestKeys(t *testing.T) {
	got := map[string]string{
		"task pk":    taskPK("3f1a"),
		"batch 0":    batchSK(0),
		"batch 42":   batchSK(42),
		"batch max":  batchSK(maxBatchNo),
		"row 7":      rowSK(7),
		"row max":    rowSK(maxRowNo),
		"cache pk":   cachePK("ab12"),
		"open shard": openShard("t", 1)[:5],
		"open sk":    openSK(time.Date(2025, 3, 1, 12, 0, 0, 5, time.UTC), "t", 3),
	}
	want := map[string]string{
		"task pk":    "TASK#3f1a",
		"batch 0":    "BATCH#00000000",
		"batch 42":   "BATCH#00000042",
		"batch max":  "BATCH#99999999",
		"row 7":      "ROW#000000007",
		"row max":    "ROW#999999999",
		"cache pk":   "CACHE#ab12",
		"open shard": "OPEN#",
		"open sk":    "2025-03-01T12:00:00.000000005Z#t#00000003",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("keys (-want +got):\n%s", d)
	}
}

func TestTaskIDOf(t *testing.T) {
	tests := []struct {
		pk      string
		want    string
		wantErr bool
	}{
		{"TASK#abc", "abc", false},
		{"TASK#a#b", "a#b", false},
		{"TASK#", "", true},
		{"CACHE#abc", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.pk, func(t *testing.T) {
			got, err := taskIDOf(tt.pk)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("taskIDOf(%q) = %q, %v; want %q, error %v", tt.pk, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestNumberBounds(t *testing.T) {
	tests := []struct {
		name    string
		check   func(int) error
		no      int
		wantErr bool
	}{
		{"batch 0", checkBatchNo, 0, false},
		{"batch max", checkBatchNo, maxBatchNo, false},
		{"batch negative", checkBatchNo, -1, true},
		{"batch too large", checkBatchNo, maxBatchNo + 1, true},
		{"row 1", checkRowNo, 1, false},
		{"row max", checkRowNo, maxRowNo, false},
		{"row negative", checkRowNo, -5, true},
		{"row too large", checkRowNo, maxRowNo + 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.check(tt.no); (err != nil) != tt.wantErr {
				t.Errorf("check(%d) = %v, want error %v", tt.no, err, tt.wantErr)
			}
		})
	}
}

// TestRowKeysSortNumerically checks that string order of the sort keys is
// numeric order, which ListRows' BETWEEN and row-order paging rely on.
func TestRowKeysSortNumerically(t *testing.T) {
	nos := []int{0, 1, 9, 10, 99, 100, 1000, 99_999, 100_000, 200_000, maxRowNo}
	keys := make([]string, len(nos))
	for i, n := range nos {
		keys[i] = rowSK(n)
	}
	if !slices.IsSorted(keys) {
		t.Errorf("row keys not in numeric order: %v", keys)
	}
}

func TestTimeEncoding(t *testing.T) {
	cst := time.FixedZone("CST", 8*3600)
	tests := []struct {
		name string
		in   time.Time
		want string
	}{
		{"zero", time.Time{}, ""},
		{"utc", time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC), "2025-03-01T12:00:00.000000000Z"},
		{"nanoseconds", time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC), "2025-03-01T12:00:00.123456789Z"},
		{"other zone", time.Date(2025, 3, 1, 20, 0, 0, 0, cst), "2025-03-01T12:00:00.000000000Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := encodeTime(tt.in)
			if got != tt.want {
				t.Fatalf("encodeTime(%v) = %q, want %q", tt.in, got, tt.want)
			}
			back, err := decodeTime(got)
			if err != nil || !back.Equal(tt.in) {
				t.Errorf("decodeTime(%q) = %v, %v; want %v", got, back, err, tt.in)
			}
		})
	}
}

func TestDecodeTime(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    time.Time
		wantErr bool
	}{
		{"empty", "", time.Time{}, false},
		{"own layout", "2025-03-01T12:00:00.000000001Z", time.Date(2025, 3, 1, 12, 0, 0, 1, time.UTC), false},
		// The export state machine writes $$.State.EnteredTime.
		{"step functions", "2025-03-01T12:00:00.123Z", time.Date(2025, 3, 1, 12, 0, 0, 123e6, time.UTC), false},
		{"offset", "2025-03-01T20:00:00+08:00", time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC), false},
		{"garbage", "yesterday", time.Time{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeTime(tt.in)
			if (err != nil) != tt.wantErr || !got.Equal(tt.want) {
				t.Errorf("decodeTime(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// TestTimesSortAsStrings checks that encoded times order like the times, so
// that lease_until < :now and the time-ordered sort keys are right.
func TestTimesSortAsStrings(t *testing.T) {
	base := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	times := []time.Time{
		{},
		time.Date(1999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		base,
		base.Add(time.Nanosecond),
		base.Add(time.Millisecond),
		base.Add(time.Second),
		base.Add(10 * time.Hour),
		time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	for i := 1; i < len(times); i++ {
		a, b := sortTime(times[i-1]), sortTime(times[i])
		if a >= b {
			t.Errorf("sortTime(%v) = %q does not sort before sortTime(%v) = %q", times[i-1], a, times[i], b)
		}
	}
}

// TestOpenBefore checks the bound ListOpenBatches queries with: batches
// changed strictly before t fall below it, those changed at or after t do
// not.
func TestOpenBefore(t *testing.T) {
	at := time.Date(2025, 3, 1, 12, 0, 30, 0, time.UTC)
	bound := openBefore(at)
	tests := []struct {
		name    string
		changed time.Time
		below   bool
	}{
		{"long before", at.Add(-time.Hour), true},
		{"a nanosecond before", at.Add(-time.Nanosecond), true},
		{"at", at, false},
		{"after", at.Add(time.Millisecond), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, task := range []string{"a", "zzzz-long-task-id", "0"} {
				sk := openSK(tt.changed, task, 12)
				if got := sk < bound; got != tt.below {
					t.Errorf("%q < %q = %v, want %v", sk, bound, got, tt.below)
				}
			}
		})
	}
}

func TestOpenShard(t *testing.T) {
	counts := map[string]int{}
	for no := range 1000 {
		s := openShard("task", no)
		if s != openShard("task", no) {
			t.Fatalf("openShard(task, %d) is not stable", no)
		}
		counts[s]++
	}
	if len(counts) != openShards {
		t.Fatalf("1000 batches used shards %v, want all %d", counts, openShards)
	}
	for s, n := range counts {
		if !strings.HasPrefix(s, "OPEN#") || n < 150 {
			t.Errorf("shard %s holds %d of 1000 batches; want an even spread", s, n)
		}
	}
}

func TestExpr(t *testing.T) {
	e := newExpr()
	u := &update{e: e}
	u.setS("state", "RUNNING")
	u.setOrRemove("owner", "")
	u.setOrRemove("error", "boom")
	u.addI("attempt", 1)
	u.del("lease_until")
	cond := e.n("state") + " = " + e.s("PENDING") + " AND " + e.in("state", []string{"A", "B"})
	got := map[string]any{
		"update": u.String(),
		"cond":   cond,
		"names":  e.attrNames(),
		"values": len(e.attrValues()),
	}
	want := map[string]any{
		"update": "SET #n0 = :v0, #n2 = :v1 REMOVE #n1, #n4 ADD #n3 :v2",
		"cond":   "#n0 = :v3 AND #n0 IN (:v4, :v5)",
		"names":  map[string]string{"#n0": "state", "#n1": "owner", "#n2": "error", "#n3": "attempt", "#n4": "lease_until"},
		"values": 6,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("expression (-want +got):\n%s", d)
	}
	if v, ok := e.attrValues()[":v2"].(*types.AttributeValueMemberN); !ok || v.Value != "1" {
		t.Errorf(":v2 = %#v, want number 1", e.attrValues()[":v2"])
	}
	empty := newExpr()
	if empty.attrNames() != nil || empty.attrValues() != nil {
		t.Error("an empty expression must give nil maps (the API refuses empty ones)")
	}
}
