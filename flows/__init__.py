"""Prefect flows (orchestration only; no algorithm code). The flows arrive with their own issue;
until then `kevin suite` and `dvc repro` run the one job the project has."""
