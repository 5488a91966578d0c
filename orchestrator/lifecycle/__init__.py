"""The services a run uses: start or reach them (services), call them (mesh), check them (preflight, agreement)."""
