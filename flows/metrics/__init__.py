"""What a monitoring platform scrapes: the daily run's numbers as a Prometheus textfile (`textfile`)."""
