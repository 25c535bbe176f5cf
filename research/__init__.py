"""Research: data engineering, input pipelines, the model zoo and experiment configs."""
