"""sparkctl lab stand-in for the `sglang` package: only `python3 -m sglang.launch_server` (launch_server.py), baked into
the lab image on Debian python3's path. Nothing here is SGLang's code, and nothing imports sparkctl."""
