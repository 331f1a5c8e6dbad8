-- The jobs table analyzed after 1,000 changes plus a fiftieth of its rows, where
-- autovacuum's default waits for a tenth: a queue's statuses shift by the minute, and
-- statistics that say no job is pending or scheduled after a burst (below a tenth of a
-- table of finished jobs) sent dispatch and the sweeps to plans that read every such
-- job once per row they moved. Sampling costs about the same at any size; autovacuum
-- runs it at most once per naptime. Instant: a reloption, no rewrite.
ALTER TABLE {schema}.jobs SET (
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000
);
