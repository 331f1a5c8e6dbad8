-- Round robin's memory: when each fairness cohort of a round-robin queue was last
-- dispatched. A cohort's rank is its position plus its running jobs; among cohorts
-- of one rank (most of them when jobs are short), the one served longest ago goes
-- first. Without it every dispatch started afresh and the cohort with the oldest
-- jobs won each tie: with one slot and three tenants, the third waited until the
-- first had drained. Jobs without a fairness key are one cohort: keyed = false.
CREATE TABLE IF NOT EXISTS {schema}.fairness_turns (
    queue text NOT NULL,
    keyed boolean NOT NULL,
    fairness_key text NOT NULL,
    served_at timestamptz NOT NULL,
    PRIMARY KEY (queue, keyed, fairness_key)
);
