-- The jobs table analyzed after every 10,000 changes, not after a tenth of its rows
-- (autovacuum's default): a queue's statuses shift by the minute, and statistics that
-- say no job is pending or scheduled after a burst (below the tenth of a table of
-- finished jobs) sent dispatch and the sweeps to plans that read every such job once
-- per row they moved. Sampling costs the same at any size; autovacuum runs it at most
-- once per naptime. Instant: a reloption, no rewrite.
ALTER TABLE {schema}.jobs SET (
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 10000
);
