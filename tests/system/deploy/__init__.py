"""The deployment files: compose, Kubernetes, dashboards."""
