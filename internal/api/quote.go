package api

import (
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/batchgen/batchgen/internal/pipeline"
	"github.com/batchgen/batchgen/internal/store"
)

// QuoteView is the body of GET /api/tasks/{id}/quote: what the rows of a
// task still without a result are expected to cost and take, measured on
// the rows already answered (a held task's sample), three ways.
type QuoteView struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	// Rows is the task's rows, Left those without a result, ToCall those
	// of them that will need a model's answer.
	Rows   int `json:"rows"`
	Left   int `json:"left"`
	ToCall int `json:"to_call"`
	// Sample is the rows the quote asked for, Tried how many of them a
	// model was asked for so far, and Measured how many answers the
	// figures come from. Sampling is true while the sample is still being
	// answered: read the quote again (or follow the task's events).
	Sample   int  `json:"sample"`
	Tried    int  `json:"tried"`
	Measured int  `json:"measured"`
	Sampling bool `json:"sampling"`
	// SpentUSD is what the measured rows cost (kept by the task); absent
	// when a price is not known.
	SpentUSD *float64 `json:"spent_usd,omitempty"`
	// InputTokens and OutputTokens are per row.
	InputTokens  SpreadView `json:"input_tokens"`
	OutputTokens SpreadView `json:"output_tokens"`
	// QuotaKnown is false when the times assume the quota does not bind.
	QuotaKnown bool `json:"quota_known"`
	// Plans are online, economy and auto, in that order.
	Plans []PlanView `json:"plans"`
	// Note says why there is no figure yet, when Measured is 0.
	Note string `json:"note,omitempty"`
}

// SpreadView is an expected value with its 90% interval.
type SpreadView struct {
	Low  float64 `json:"low"`
	Mid  float64 `json:"mid"`
	High float64 `json:"high"`
}

// PlanView is one plan of a quote (pipeline.Plan).
type PlanView struct {
	Mode    string `json:"mode"`
	Offered bool   `json:"offered"`
	// Note words the plan's terms or why it is not offered.
	Note string `json:"note,omitempty"`
	// CostUSD is absent when a price is not known.
	CostUSD *SpreadView `json:"cost_usd,omitempty"`
	// Seconds is how long it takes, absent when not known (economy: the
	// provider's batch window).
	Seconds *SpreadView `json:"seconds,omitempty"`
	// EconomySeconds is how long an auto plan waits on the batch API
	// before the rows left go online.
	EconomySeconds float64 `json:"economy_seconds,omitempty"`
}

// quoteTask prices the rows left of a task from its answered rows. For an
// auto plan the deadline is the task's own, or ?deadline= (a duration
// such as 6h, or RFC 3339).
func (s *server) quoteTask(w http.ResponseWriter, r *http.Request) {
	task, ok := s.ownedTask(w, r)
	if !ok {
		return
	}
	now := s.cfg.Clock.Now()
	deadline := task.Deadline
	if v := r.URL.Query().Get("deadline"); v != "" {
		_, d, err := pipeline.ParseModeDeadline(string(store.ModeAuto), v, now)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
			return
		}
		deadline = d
	}
	p := pipeline.QuoteParams{Prices: s.cfg.Prices, RowsToCall: -1}
	if s.cfg.QuotePace != nil {
		pace := s.cfg.QuotePace()
		p.RequestsPerSecond, p.Concurrency = pace.RequestsPerSecond, pace.Concurrency
	}
	task, err := pipeline.LiveCounts(r.Context(), s.cfg.Store, task)
	if err != nil {
		s.internalError(w, r, "quote task", err)
		return
	}
	q, err := pipeline.QuoteTask(r.Context(), s.cfg.Store, task, p)
	v := QuoteView{ID: task.ID, Status: string(task.State), Rows: q.Rows, Left: q.Left, ToCall: q.ToCall,
		Sample: q.Asked, Tried: q.Tried, Measured: q.Measured, Sampling: q.Sampling, QuotaKnown: q.QuotaKnown}
	switch {
	case errors.Is(err, pipeline.ErrNothingMeasured):
		v.Note = "no row answered by a model yet"
		if !q.Sampling {
			v.Note += "; the sample's rows failed or came from the cache"
		}
		v.Plans = []PlanView{}
		WriteJSON(w, http.StatusOK, v)
		return
	case err != nil:
		s.internalError(w, r, "quote task", err)
		return
	}
	if q.CostKnown {
		spent := q.Spent
		v.SpentUSD = &spent
	}
	v.InputTokens, v.OutputTokens = spreadView(q.InputTokens), spreadView(q.OutputTokens)
	var until time.Duration
	if !deadline.IsZero() {
		until = deadline.Sub(now)
	}
	for _, plan := range q.Plans(s.cfg.Limits.BatchModes, until) {
		pv := PlanView{Mode: plan.Mode.String(), Offered: plan.Offered, Note: plan.Why, EconomySeconds: plan.EconomyFor.Seconds()}
		if plan.Offered && q.CostKnown {
			c := spreadView(plan.Cost)
			pv.CostUSD = &c
		}
		if plan.Duration[2] > 0 {
			pv.Seconds = &SpreadView{Low: seconds(plan.Duration[0]), Mid: seconds(plan.Duration[1]), High: seconds(plan.Duration[2])}
		}
		v.Plans = append(v.Plans, pv)
	}
	WriteJSON(w, http.StatusOK, v)
}

func spreadView(s pipeline.Spread) SpreadView {
	return SpreadView{Low: s.Low, Mid: s.Mid, High: s.High}
}

// seconds rounds d to tenths of a second.
func seconds(d time.Duration) float64 { return math.Round(d.Seconds()*10) / 10 }

// startTask starts a held task, with the plan its owner chose.
func (s *server) startTask(w http.ResponseWriter, r *http.Request) {
	owned, ok := s.ownedTask(w, r)
	if !ok {
		return
	}
	if s.cfg.Starter == nil {
		writeError(w, http.StatusNotImplemented, "not_implemented", "this deployment cannot hold tasks for a quote")
		return
	}
	// The optional body is the plan chosen from the quote: its mode,
	// deadline and cap, as a retry takes them.
	var req termsRequest
	if !s.decodeOptionalJSON(w, r, &req) {
		return
	}
	change, err := s.termsChange(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	task, _, err := s.cfg.Starter.Start(r.Context(), pipeline.StartParams{TaskID: owned.ID, Now: s.cfg.Clock.Now(), Change: change})
	var state *pipeline.StateError
	switch {
	case errors.Is(err, store.ErrNotFound):
		notFound(w, owned.ID)
		return
	case errors.As(err, &state):
		writeError(w, http.StatusConflict, "conflict", state.Error())
		return
	case err != nil && task.ID == "":
		s.internalError(w, r, "start task", err)
		return
	case err != nil:
		// Started, but its batches were not all sent: the sweeper sends
		// the batches that wait.
		s.cfg.Logger.Warn("start task: the sweeper will send the batches that wait", "task_id", owned.ID, "error", err)
	}
	WriteJSON(w, http.StatusAccepted, s.viewOf(task))
}
