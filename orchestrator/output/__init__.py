"""What a run leaves: its logs as it goes (loggers: metrics, validation and samples to files and every sink
asked for), its report at the end (report: curves.png and summary.md)."""
