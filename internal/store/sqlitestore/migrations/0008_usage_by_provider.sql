-- The task's token sums split by the provider label its rows record, a JSON
-- object {label: {input_tokens, output_tokens, cached_input_tokens}}, kept by
-- the same writes as the task's sums, so a task routed over providers of
-- different prices is priced per provider without reading its rows.
ALTER TABLE tasks ADD COLUMN usage_by_provider TEXT NOT NULL DEFAULT '{}';
-- Existing tasks get the split their sums were counted from: the rows of
-- their DONE batches (what FinishBatch added and a reopen recounts).
UPDATE tasks SET usage_by_provider = (
	SELECT json_group_object(provider, json_object(
		'input_tokens', i, 'output_tokens', o, 'cached_input_tokens', c))
	FROM (SELECT r.provider AS provider, sum(r.input_tokens) AS i, sum(r.output_tokens) AS o,
			sum(r.cached_input_tokens) AS c
		FROM rows r JOIN batches b ON b.task_id = r.task_id
			AND r.no BETWEEN b.first_row AND b.first_row + b.row_count - 1
		WHERE r.task_id = tasks.id AND b.state = 'DONE'
		GROUP BY r.provider
		HAVING sum(r.input_tokens) + sum(r.output_tokens) + sum(r.cached_input_tokens) > 0))
WHERE input_tokens + output_tokens + cached_input_tokens > 0;
