-- jobs_running_identity_key (01.00.04_01) serves every read the non-unique
-- jobs_running_identity_idx served (the identity gate and the per-actor running
-- count); keeping both costs an index entry more on every dispatch. Dropped once
-- no worker of the previous version runs.
DROP INDEX IF EXISTS {schema}.jobs_running_identity_idx;
