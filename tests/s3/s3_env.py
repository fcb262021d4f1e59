#!/usr/bin/env python3
"""Runs a command beside a real S3-compatible server on loopback.

  s3_env.py [--auth] COMMAND [ARGS...]

Starts moto's standalone server (moto[server] from PyPI) on a free
127.0.0.1 port, and the fault proxy (s3_fault_proxy.py) in front of it,
creates the bucket dcp-test, runs COMMAND with
  AWS_ENDPOINT_URL   the server          DCP_S3_PROXY   the proxy
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION
  DCP_S3_BUCKET      dcp-test            DCP_S3_FAULTS  the proxy's fault file
and stops both. With --auth, moto checks every request's SigV4 signature
and the key's IAM policy (INITIAL_NO_AUTH_ACTION_COUNT): an IAM user with
s3:* is made first and its key exported (DCP_S3_AUTH=1). Exit status: COMMAND's; 77 (skip) when moto is missing.
Everything is bounded: 60 s for the server to answer, 600 s for COMMAND.
"""
import os
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


def main():
    try:
        import boto3  # noqa: F401
        import moto  # noqa: F401
    except ImportError as e:
        print(f"s3_env: SKIP, {e} (scripts/deps.sh installs moto[server], boto3)")
        return 77
    import s3_fault_proxy

    args = sys.argv[1:]
    auth = bool(args) and args[0] == "--auth"
    if auth:
        args = args[1:]
    port = free_port()
    env = dict(os.environ)
    env.update(AWS_ACCESS_KEY_ID="dcptestkey", AWS_SECRET_ACCESS_KEY="dcptestsecret",
               AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1")
    env.pop("AWS_SESSION_TOKEN", None)
    env.pop("AWS_ENDPOINT_URL_S3", None)
    srv_env = dict(env)
    if auth:
        srv_env["INITIAL_NO_AUTH_ACTION_COUNT"] = "5"
    srv = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                            "-p", str(port)], env=srv_env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    tmp = tempfile.mkdtemp(prefix="dcp-s3-")
    faults = os.path.join(tmp, "faults")
    open(faults, "w").close()
    proxy = None
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=2).read()
                break
            except Exception:
                if srv.poll() is not None or time.monotonic() > deadline:
                    print("s3_env: moto server did not start", file=sys.stderr)
                    return 1
                time.sleep(0.2)
        import boto3
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
            env.update(AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk, DCP_S3_AUTH="1")
            tmpc = boto3.client("sts", endpoint_url=url, region_name="us-east-1",
                                aws_access_key_id=ak, aws_secret_access_key=sk
                                ).assume_role(
                RoleArn="arn:aws:iam::123456789012:role/dcp-role",
                RoleSessionName="dcp")["Credentials"]
            env.update(DCP_S3_TMP_KEY=tmpc["AccessKeyId"],
                       DCP_S3_TMP_SECRET=tmpc["SecretAccessKey"],
                       DCP_S3_TMP_TOKEN=tmpc["SessionToken"])
        boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                     aws_access_key_id=ak,
                     aws_secret_access_key=sk).create_bucket(Bucket="dcp-test")
        proxy = s3_fault_proxy.start("127.0.0.1", 0, "127.0.0.1", port, faults)
        env.update(AWS_ENDPOINT_URL=url, DCP_S3_BUCKET="dcp-test", DCP_S3_FAULTS=faults,
                   DCP_S3_PROXY=f"http://127.0.0.1:{proxy.server_address[1]}")
        try:
            return subprocess.run(args, env=env, timeout=600).returncode
        except subprocess.TimeoutExpired:
            print("s3_env: command timed out after 600 s", file=sys.stderr)
            return 1
    finally:
        if proxy:
            proxy.shutdown()
        srv.terminate()
        try:
            srv.wait(timeout=10)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


if __name__ == "__main__":
    sys.exit(main())
