#!/usr/bin/env python3
"""The cluster's storage node: radosgw (tests/s3/rgw_server.py, the project's
own bring-up) serving S3 on the storage node's address, run by cluster.sh
inside the storage node's namespaces.

  store.py STATE_DIR ADDRESS MEMSTORE_BYTES

Brings radosgw up in STATE_DIR/store (monitor and OSD on the namespace's
127.0.0.1, radosgw on ADDRESS), creates the bucket dcp-cluster, writes the
URL to STATE_DIR/store.url (atomically: cluster.sh waits for it) and stays
in the foreground until SIGTERM/SIGINT, then stops the daemons (they also
die with this process: rgw_server gives them PR_SET_PDEATHSIG). On a failure
to start, the reason goes to STATE_DIR/store.err and the exit status is 1.
"""
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "s3"))

import rgw_server  # noqa: E402

KEY, SECRET, BUCKET = "dcpclusterkey", "dcpclustersecret", "dcp-cluster"


def main():
    state, addr, memstore = sys.argv[1], sys.argv[2], int(sys.argv[3])
    err = os.path.join(state, "store.err")
    try:
        srv = rgw_server.start(os.path.join(state, "store"), KEY, SECRET,
                               memstore_bytes=memstore, host=addr, tries=2)
    except Exception as e:  # RuntimeError with the daemons' logs
        with open(err, "w") as f:
            f.write(f"radosgw did not come up: {e}\n")
        return 1
    stop = {"now": False}

    def on_signal(signum, frame):
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        import boto3
        from botocore.config import Config
        s3 = boto3.client("s3", endpoint_url=srv.url, region_name="us-east-1",
                          aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                          config=Config(retries={"max_attempts": 3},
                                        connect_timeout=5, read_timeout=30))
        s3.create_bucket(Bucket=BUCKET)
        tmp = os.path.join(state, "store.url.tmp")
        with open(tmp, "w") as f:
            f.write(srv.url + "\n")
        os.rename(tmp, os.path.join(state, "store.url"))
        while not stop["now"]:
            signal.pause()
    except Exception as e:
        with open(err, "w") as f:
            f.write(f"storage node: {e}\n")
        return 1
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
