"""Warm rank pools (issue 31): one launch of a world runs arm after arm; host.py writes the tasks, worker.py
runs them in every rank, isolation.py puts back what an arm changed."""
