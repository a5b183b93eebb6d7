"""The docket audit dashboard and the Prometheus/Grafana assets for shops that use them."""
