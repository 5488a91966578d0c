"""What a run leaves: its logs as it goes (loggers: metrics, validation and samples to files and every sink
asked for; readings: what a step's samples are read as, its score metrics and the sample log's rows), its
report at the end (report: curves.png and summary.md)."""
