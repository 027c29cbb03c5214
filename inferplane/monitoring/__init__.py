"""Monitoring for one host (docs/monitoring.md): a Prometheus scrape config whose targets
(file_sd JSON, `targets`) the runtime rewrites as instances start and stop (`live`), and
the P49 alert rules and Grafana dashboard taken from the Kubernetes renderer (`files`)."""
