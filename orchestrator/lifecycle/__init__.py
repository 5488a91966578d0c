"""The services a run uses: start or reach them (services), call them (mesh), check them (preflight, agreement).

- roles: which services a run's config asks for, and the settings and `meshrl serve` arguments of each.
- fleet: the rollout fleet (rollout.replicas or the addresses given) and which replica serves each call.
- rollout_checks: preflight's checks of how the rollout is asked to sample (backends, fleets, lengths).
- scorer_inputs: what the run's scorer reads from each row, checked against the data before any service starts.
- tool_template: whether the model's chat template speaks tools, checked before any service starts.
"""
