"""Interop with a client no one here wrote: boto3 lists and reads what dcp's
S3 client wrote (whole and multipart, odd key names) and dcp reads what
boto3 wrote. Run by s3_env.py (the server on loopback); argv[1] is the
s3_put_get helper."""
import base64
import hashlib
import os
import subprocess
import sys
import tempfile
import zlib

import boto3

helper = sys.argv[1]
bucket = os.environ["DCP_S3_BUCKET"]
# radosgw 16 (Ceph Pacific) predates S3's additional checksums: it keeps
# none, so only moto's can be checked
server = os.environ.get("DCP_S3_SERVER", "moto")
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"],
                  region_name=os.environ["AWS_REGION"])
tmp = tempfile.mkdtemp(prefix="dcp-s3-interop-")
fails = 0
keys = {"interop/small.bin": 12345, "interop/odd key +%=~ \u00fc.bin": 777,
        "interop/multi.bin": (12 << 20) + 5}
for key, n in keys.items():
    data = os.urandom(n)
    src = os.path.join(tmp, "src")
    with open(src, "wb") as f:
        f.write(data)
    mode = "mput" if n > (5 << 20) else "put"
    subprocess.run([helper, mode, bucket, key, src], check=True, timeout=120)
    got = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    if got != data:
        print(f"FAIL boto3 read of dcp's {key}: {len(got)} bytes vs {len(data)}")
        fails += 1
    # dcp sent S3's CRC32 checksum: a multipart upload keeps one over its
    # parts; a PUT's is the object's own (moto keeps it only with the AWS
    # SDKs' x-amz-sdk-checksum-algorithm header, which dcp does not send:
    # when kept, it must be the object's CRC-32)
    ck = s3.head_object(Bucket=bucket, Key=key,
                        ChecksumMode="ENABLED").get("ChecksumCRC32")
    want_ck = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    if mode == "put" and ck is not None and ck != want_ck:
        print(f"FAIL checksum of dcp's {key}: {ck} vs {want_ck}")
        fails += 1
    if mode == "mput" and not ck and server != "rgw":
        print(f"FAIL no checksum on dcp's multipart {key}")
        fails += 1
    if mode == "mput":
        # the multipart ETag every store makes: the MD5 of the parts' MD5s
        # (s3_put_get sends parts of 5 MiB), and their number
        P = 5 << 20
        md5s = b"".join(hashlib.md5(data[o:o + P]).digest() for o in range(0, n, P))
        want_tag = f'"{hashlib.md5(md5s).hexdigest()}-{(n + P - 1) // P}"'
        tag = s3.head_object(Bucket=bucket, Key=key)["ETag"]
        if tag != want_tag:
            print(f"FAIL multipart ETag of dcp's {key}: {tag} vs {want_tag}")
            fails += 1
    # and back: boto3 writes, dcp reads
    key2 = key.replace("interop/", "interop/boto-")
    s3.put_object(Bucket=bucket, Key=key2, Body=data[::-1])
    dst = os.path.join(tmp, "dst")
    subprocess.run([helper, "get", bucket, key2, dst], check=True, timeout=120)
    with open(dst, "rb") as f:
        if f.read() != data[::-1]:
            print(f"FAIL dcp read of boto3's {key2}")
            fails += 1
listed = set()
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="interop/"):
    listed.update(o["Key"] for o in page.get("Contents", []))
want = set(keys) | {k.replace("interop/", "interop/boto-") for k in keys}
if listed != want:
    print(f"FAIL boto3 listing: {sorted(listed ^ want)}")
    fails += 1
ups = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
if ups:
    print(f"FAIL multipart uploads left: {ups}")
    fails += 1
print("interop: " + ("ok" if not fails else f"{fails} failures"))
sys.exit(1 if fails else 0)
