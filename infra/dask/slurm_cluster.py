"""Start a Dask cluster on Slurm with dask-jobqueue and print its scheduler address.

    pip install dask-jobqueue
    python infra/dask/slurm_cluster.py --jobs 8 &      # keeps running; prints the address
    ctrpipe run --date YYYY-MM-DD --set dask.address=tcp://<login-node>:8786 ...

The scheduler runs in this process (on the login/submit node); each Slurm job
runs one single-threaded worker process.  Workers must see the same code and
environment as the flow (a shared venv path) and the same root (S3, or a
shared filesystem such as Lustre/NFS).  Stop it with Ctrl-C: the jobs are
cancelled.
"""

from __future__ import annotations

import argparse
import time

from dask_jobqueue import SLURMCluster


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=8, help="Slurm jobs, one Dask worker each")
    parser.add_argument("--queue", default="cpu")
    parser.add_argument("--account", default=None)
    parser.add_argument("--port", type=int, default=8786)
    parser.add_argument("--venv", default="/shared/ctr-pipeline/.venv", help="environment the workers activate")
    args = parser.parse_args()
    cluster = SLURMCluster(
        queue=args.queue,
        account=args.account,
        cores=1,  # one core per job: the tasks are single-threaded
        processes=1,
        memory="6GiB",
        walltime="04:00:00",
        job_script_prologue=[f"source {args.venv}/bin/activate"],
        scheduler_options={"port": args.port, "dashboard_address": ":8787"},
        worker_extra_args=["--nthreads", "1"],
    )
    cluster.scale(jobs=args.jobs)
    print(cluster.job_script())
    print(f"dask.address: {cluster.scheduler_address}", flush=True)
    try:
        while True:
            time.sleep(60)
    except KeyboardInterrupt:
        cluster.close()


if __name__ == "__main__":
    main()
