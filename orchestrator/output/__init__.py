"""What a run leaves: its logs as it goes, its report at the end."""
