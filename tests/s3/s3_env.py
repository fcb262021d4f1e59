#!/usr/bin/env python3
"""Runs a command beside a real S3-compatible server on loopback.

  s3_env.py [--server moto|rgw] [--auth] COMMAND [ARGS...]

Starts an S3 server on a free 127.0.0.1 port — moto's standalone server
(moto[server] from PyPI; the default) or Ceph's radosgw on a one-node
cluster (rgw_server.py; Debian's ceph-mon, ceph-osd, radosgw) — and the
fault proxy (s3_fault_proxy.py) in front of it, creates the bucket
dcp-test, runs COMMAND with
  AWS_ENDPOINT_URL   the server          DCP_S3_PROXY   the proxy
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION
  DCP_S3_BUCKET      dcp-test            DCP_S3_FAULTS  the proxy's fault file
  DCP_S3_SERVER      moto or rgw        DCP_S3_PYTHON  a python with boto3
(and a second bucket, dcp-test-gone, for a test to delete)
and stops them. radosgw always checks signatures (DCP_S3_SIGCHECK=1 then,
as with --auth). With --auth (moto only), moto checks every request's SigV4
signature and the key's IAM policy (INITIAL_NO_AUTH_ACTION_COUNT): an IAM
user with s3:* is made first and its key exported (DCP_S3_AUTH=1, and the
temporary credentials of an assumed role in DCP_S3_TMP_*).
Exit status: COMMAND's; 77 (skip) when the server's software is missing,
except under CI=true, where that fails (1): CI installs it
(scripts/deps.sh). Everything is bounded: 60 s for moto to answer, 120 s
for the cluster to come up, 600 s for COMMAND (DCP_S3_ENV_TIMEOUT
seconds if set: make bench-s3).
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def skip_or_fail(why):
    """77 (skip) for software that is missing; 1 under CI, which installs it."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        print(f"s3_env: FAIL, {why} (CI=true: scripts/deps.sh installs it)", file=sys.stderr)
        return 1
    print(f"s3_env: SKIP, {why} (scripts/deps.sh installs it)")
    return 77


def start_moto(port, env, auth):
    """moto's server on port; returns (url, stop)."""
    srv_env = dict(env)
    if auth:
        srv_env["INITIAL_NO_AUTH_ACTION_COUNT"] = "5"
    srv = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                            "-p", str(port)], env=srv_env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)

    def stop():
        srv.terminate()
        try:
            srv.wait(timeout=10)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()

    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=2).read()
            return url, stop
        except Exception:
            if srv.poll() is not None or time.monotonic() > deadline:
                stop()
                raise RuntimeError("moto server did not start")
            time.sleep(0.2)


def main():
    args = sys.argv[1:]
    server, auth = "moto", False
    while args and args[0] in ("--auth", "--server"):
        if args[0] == "--auth":
            auth, args = True, args[1:]
        elif len(args) >= 2 and args[1] in ("moto", "rgw"):
            server, args = args[1], args[2:]
        else:
            print("s3_env: --server takes moto or rgw", file=sys.stderr)
            return 2
    if auth and server != "moto":
        print("s3_env: --auth is moto's IAM; radosgw checks signatures always", file=sys.stderr)
        return 2
    try:
        import boto3
        if server == "moto":
            import moto  # noqa: F401
    except ImportError as e:
        return skip_or_fail(f"{e}: moto[server] and boto3 are needed")
    import s3_fault_proxy
    import rgw_server
    if server == "rgw" and rgw_server.missing():
        return skip_or_fail(f"no {', '.join(rgw_server.missing())} on PATH: "
                            "Debian's ceph-mon, ceph-osd, radosgw are needed")

    env = dict(os.environ)
    env.update(AWS_ACCESS_KEY_ID="dcptestkey", AWS_SECRET_ACCESS_KEY="dcptestsecret",
               AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1", DCP_S3_SERVER=server)
    for k in ("AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "DCP_S3_AUTH", "DCP_S3_SIGCHECK"):
        env.pop(k, None)
    tmp = tempfile.mkdtemp(prefix="dcp-s3-")
    faults = os.path.join(tmp, "faults")
    open(faults, "w").close()
    proxy = None
    stop = None
    try:
        try:
            if server == "moto":
                url, stop = start_moto(free_port(), env, auth)
            else:
                rgw = rgw_server.start(os.path.join(tmp, "rgw"), "dcptestkey", "dcptestsecret",
                                       memstore_bytes=int(os.environ.get(
                                           "DCP_RGW_MEMSTORE_BYTES", 16 << 30)))
                url, stop = rgw.url, rgw.stop
                env["DCP_S3_SIGCHECK"] = "1"
        except RuntimeError as e:
            print(f"s3_env: {e}", file=sys.stderr)
            return 1
        ak, sk = "dcptestkey", "dcptestsecret"
        if auth:
            iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1",
                               aws_access_key_id=ak, aws_secret_access_key=sk)
            iam.create_user(UserName="dcp")
            key = iam.create_access_key(UserName="dcp")["AccessKey"]
            allow = ('{"Version":"2012-10-17","Statement":[{"Effect":"Allow",'
                     '"Action":["s3:*","sts:AssumeRole"],"Resource":"*"}]}')
            iam.put_user_policy(UserName="dcp", PolicyName="s3", PolicyDocument=allow)
            # a role for temporary credentials (a session token)
            iam.create_role(RoleName="dcp-role", AssumeRolePolicyDocument=(
                '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":'
                '{"AWS":"arn:aws:iam::123456789012:user/dcp"},"Action":"sts:AssumeRole"}]}'))
            iam.put_role_policy(RoleName="dcp-role", PolicyName="s3", PolicyDocument=allow)
            ak, sk = key["AccessKeyId"], key["SecretAccessKey"]
            env.update(AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk, DCP_S3_AUTH="1",
                       DCP_S3_SIGCHECK="1")
            tmpc = boto3.client("sts", endpoint_url=url, region_name="us-east-1",
                                aws_access_key_id=ak, aws_secret_access_key=sk
                                ).assume_role(
                RoleArn="arn:aws:iam::123456789012:role/dcp-role",
                RoleSessionName="dcp")["Credentials"]
            env.update(DCP_S3_TMP_KEY=tmpc["AccessKeyId"],
                       DCP_S3_TMP_SECRET=tmpc["SecretAccessKey"],
                       DCP_S3_TMP_TOKEN=tmpc["SessionToken"])
        for b in ("dcp-test", "dcp-test-gone"):  # the second for a test to delete
            boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                         aws_access_key_id=ak,
                         aws_secret_access_key=sk).create_bucket(Bucket=b)
        proxy = s3_fault_proxy.start("127.0.0.1", 0, "127.0.0.1", int(url.rsplit(":", 1)[1]),
                                     faults)
        env.update(AWS_ENDPOINT_URL=url, DCP_S3_BUCKET="dcp-test", DCP_S3_FAULTS=faults,
                   DCP_S3_PYTHON=sys.executable,
                   DCP_S3_PROXY=f"http://127.0.0.1:{proxy.server_address[1]}")
        limit = int(os.environ.get("DCP_S3_ENV_TIMEOUT", "600"))
        try:
            return subprocess.run(args, env=env, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            print(f"s3_env: command timed out after {limit} s", file=sys.stderr)
            return 1
    finally:
        if proxy:
            proxy.shutdown()
        if stop:
            stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
