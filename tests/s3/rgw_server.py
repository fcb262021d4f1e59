#!/usr/bin/env python3
"""A one-node Ceph cluster with radosgw on loopback, for the s3 tests.

  rgw_server.start(workdir, access_key, secret_key) -> RgwServer
  server.url, server.stop()

Ceph Pacific from Debian 12 (packages ceph-mon, ceph-osd, radosgw;
scripts/deps.sh installs them): one monitor, one OSD on memstore (objects
in the OSD's memory, a size limit of memstore_bytes), no manager, no cephx
(auth none, plain crc messenger mode: everything is on 127.0.0.1 and the
cluster lives only as long as the test), and radosgw's beast front end on a
free 127.0.0.1 port, with an S3 user of the given key made before it
starts. Pools are made with one replica and 8 placement groups. Deleted
and overwritten objects' data is collected at once (rgw gc every 2 s, no
minimum wait; radosgw's defaults hold it for hours, which would fill
memstore in a benchmark that saves 1.5 GB over and over). The beast front
end runs with tcp_nodelay=1: without it radosgw 16 answers small bodies
(errors, small objects) 40 ms late (Nagle's algorithm against the
client's delayed ACK), and every small request of a save costs that. Every
daemon runs in the foreground as a child of this process, in its own
process group, and stop() kills them all; their logs stay in
workdir/log (printed on a failure to start).

Bring-up takes a few seconds (the monitor, the OSD's boot, radosgw's
first pools); every step is bounded (start_timeout s in all).

  python3 rgw_server.py [DIR]  starts one (in DIR, made empty, or a new
                               temporary directory), prints its URL,
                               waits for ^C
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph-authtool",
            "ceph")


def missing():
    """The binaries this needs that are not on PATH (empty: all there)."""
    return [b for b in BINARIES if shutil.which(b) is None]


def _free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent():
    """In the child: SIGKILL when this process dies (a test killed by its
    timeout must not leave daemons behind)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


CONF = """[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{mon_port}
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
ms mon client mode = crc
ms mon service mode = crc
ms mon cluster mode = crc
ms client mode = crc
ms service mode = crc
ms cluster mode = crc
ms bind ipv4 = true
ms bind ipv6 = false
public addr = 127.0.0.1
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
paxos propose interval = 0.05
paxos min wait = 0.01
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
osd objectstore = memstore
memstore device bytes = {memstore_bytes}
osd data = {d}/osd.$id
mon data = {d}/mon.$id
run dir = {d}/run
admin socket =
log file = {d}/log/$name.log
log to stderr = false
err to stderr = false
keyring = {d}/keyring
crash dir = {d}/crash
rgw data = {d}/rgw
rgw frontends = beast endpoint={rgw_host}:{rgw_port} tcp_nodelay=1
rgw thread pool size = 128
rgw gc obj min wait = 0
rgw gc processor period = 2
rgw gc processor max time = 2
rgw dns name = {rgw_host}
"""


class RgwServer:
    def __init__(self, workdir):
        self.dir = workdir
        self.conf = os.path.join(workdir, "ceph.conf")
        self.procs = []
        self.url = None

    def _run(self, args, timeout):
        r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: exit {r.returncode}: {r.stdout[-2000:]}")
        return r.stdout

    def _daemon(self, args):
        p = subprocess.Popen(args + ["-f", "-c", self.conf], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True,
                             preexec_fn=_die_with_parent)
        self.procs.append(p)
        return p

    def _alive(self):
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited with {p.returncode}")

    def logs(self):
        out = []
        logdir = os.path.join(self.dir, "log")
        for name in sorted(os.listdir(logdir)) if os.path.isdir(logdir) else []:
            with open(os.path.join(logdir, name), errors="replace") as f:
                out.append(f"--- {name} (last lines)\n" + "".join(f.readlines()[-15:]))
        return "\n".join(out)

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []


def start(workdir, access_key, secret_key, memstore_bytes=16 << 30, start_timeout=120,
          tries=3, host="127.0.0.1"):
    """Brings a cluster up in workdir (made empty) and returns it, serving S3
    at .url with an S3 user of access_key/secret_key. radosgw listens on
    host (127.0.0.1; scripts/cluster/ gives the storage node's address, the
    monitor and OSD stay on 127.0.0.1 of its namespace). Up to tries times, on
    fresh ports (a port taken between choosing it and a daemon binding it
    fails a try). Raises RuntimeError (the daemons stopped, the last try's
    logs in the message) when it cannot."""
    for t in range(tries):
        try:
            return _start(workdir, access_key, secret_key, memstore_bytes, start_timeout,
                          host)
        except RuntimeError:
            if t + 1 == tries:
                raise


def _start(workdir, access_key, secret_key, memstore_bytes, start_timeout, host):
    d = workdir
    if os.path.exists(d):
        shutil.rmtree(d)
    for sub in ("mon.a", "osd.0", "run", "log", "rgw"):
        os.makedirs(os.path.join(d, sub))
    srv = RgwServer(d)
    mon_port, rgw_port = _free_port(), _free_port(host)
    fsid, osd_uuid = str(uuid.uuid4()), str(uuid.uuid4())
    with open(srv.conf, "w") as f:
        f.write(CONF.format(fsid=fsid, mon_port=mon_port, rgw_port=rgw_port, d=d,
                            memstore_bytes=memstore_bytes, rgw_host=host))
    deadline = time.monotonic() + start_timeout

    def left():
        t = deadline - time.monotonic()
        if t <= 0:
            raise RuntimeError(f"radosgw cluster did not come up within {start_timeout} s")
        return t

    try:
        c = ["-c", srv.conf]
        srv._run(["ceph-authtool", "--create-keyring", os.path.join(d, "keyring"), "--gen-key",
                  "-n", "mon.", "--cap", "mon", "allow *"], left())
        srv._run(["monmaptool", "--create", "--fsid", fsid, "--addv", "a",
                  f"[v2:127.0.0.1:{mon_port}]", os.path.join(d, "monmap")], left())
        srv._run(["ceph-mon"] + c + ["--mkfs", "-i", "a", "--monmap", os.path.join(d, "monmap"),
                                     "--keyring", os.path.join(d, "keyring")], left())
        srv._daemon(["ceph-mon", "-i", "a"])
        srv._alive()
        tmo = ["--connect-timeout", "30"]
        srv._run(["ceph"] + c + tmo + ["osd", "new", osd_uuid], left())
        srv._run(["ceph-osd"] + c + ["-i", "0", "--mkfs", "--osd-uuid", osd_uuid], left())
        srv._daemon(["ceph-osd", "-i", "0"])
        while "1 up" not in srv._run(["ceph"] + c + tmo + ["osd", "stat"], left()):
            srv._alive()
            time.sleep(0.2)
        # The user before radosgw: radosgw-admin makes the pools it needs.
        srv._run(["radosgw-admin"] + c + ["user", "create", "--uid=dcp", "--display-name=dcp",
                                          f"--access-key={access_key}",
                                          f"--secret-key={secret_key}"], left())
        srv._daemon(["radosgw", "-n", "client.rgw"])
        url = f"http://{host}:{rgw_port}"
        while True:
            left()
            srv._alive()
            try:
                body = urllib.request.urlopen(url + "/", timeout=2).read()
                # radosgw's anonymous bucket listing, not another server that
                # took the port meanwhile
                if b"ListAllMyBucketsResult" in body and b"anonymous" in body:
                    break
            except Exception:
                pass
            time.sleep(0.2)
        time.sleep(0.2)
        srv._alive()  # it bound its port: a server already there makes it exit
        srv.url = url
        return srv
    except Exception as e:
        logs = srv.logs()
        srv.stop()
        raise RuntimeError(f"{e}\n{logs}") from None


if __name__ == "__main__":
    t0 = time.monotonic()
    import tempfile
    made = None if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="dcp-rgw-")
    s = start(sys.argv[1] if not made else os.path.join(made, "c"), "dcptestkey",
              "dcptestsecret")
    print(f"radosgw at {s.url} after {time.monotonic() - t0:.1f} s", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        s.stop()
        if made:
            shutil.rmtree(made, ignore_errors=True)
