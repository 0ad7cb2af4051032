"""Moved to benchmarks/feed_rate.py. This shim stays because the GPU machine's check script, which this project does
not own, runs `python3 jobs/feed_rate.py`; it runs the moved script as it is, with the same arguments."""
import os
import runpy

if __name__ == "__main__":
    runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "feed_rate.py"),
                   run_name="__main__")
