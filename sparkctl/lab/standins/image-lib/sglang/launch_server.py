"""sparkctl lab stand-in for SGLang's server, `python3 -m sglang.launch_server` (release $SPARKCTL_LAB_SGLANG_VERSION,
default 0.5.8: the release of nvcr.io/nvidia/sglang:26.02-py3). No GPU, no model: it checks what the real one checks
where a cluster tool can get it wrong, and serves an OpenAI-style API whose every decoding step is a round trip to
every other node's rank, so serving breaks when the fabric between the nodes breaks. Standard library only (Debian
python3, python3-yaml for --config); nothing of sparkctl's (the lab is an island).

- Flags: a real argparse.ArgumentParser built from the release's own (sparkctl's sglang_releases.json, baked into the
  image, read from SGLang's source): option strings as written (`--tp_size` is unknown), a unique prefix taken
  (allow_abbrev), on/off flags store_true, typed values, choices, nargs, aliases, the release's prog; `--config FILE`
  (YAML, two tokens) merged first as SGLang's ConfigArgumentMerger does. Its refusals are argparse's own: usage,
  `launch_server.py: error: ...`, exit 2. A flag the release refuses outright (DeprecatedAction) raises its ValueError
  (to 0.5.12) or is refused by the parser with the release's message (0.5.18 on).
- ServerArgs' start-up checks as the release records them, evaluated over the flags (what depends on the model, the
  GPU or the environment is not judged): topk or draft tokens without num-steps (AssertionError), num-steps without
  topk (TypeError), an algorithm the release does not know; (tp x pp) not divisible by --nnodes (AssertionError); and,
  a Spark having one GPU, more than one rank per node (CUDA's invalid device ordinal). A traceback ending in the
  release's line on stderr, exit 1.
- The model and the draft: a local dir, or a repo id in the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub:
  models--org--name/refs/main -> snapshots/<rev>/) with config.json, else transformers' OSError naming it; a
  --context-length beyond the model's, SGLang's ValueError; the weights (*.safetensors, *.bin) when they load, after
  the ranks meet, else SGLang's RuntimeError.
- --nnodes N > 1: the ranks meet at --dist-init-addr H:P as torch's TCP store does: rank 0 listens on P (H must be one
  of its own addresses, else its own store client cannot reach it either and says so), the others connect and retry
  for as long as it takes, printing torch's warning every 10 s. Without --dist-init-addr each node initialises on its
  own and the ranks never meet (said once). Then the cross-node message queue: each rank advertises SGLANG_HOST_IP,
  else HOST_IP, else the address of SGLANG_LOCAL_IP_NIC (the releases that read it), else the default route's
  interface's, else its first non-loopback IPv4 address; rank 0 listens on P+1 and rank r on P+1+r, on every address
  it owns; rank 0 connects to each rank at its advertised address and each rank to rank 0's. One that cannot be made
  (an address its rank does not own, unreachable) hangs both ranks after NCCL's lines, without a word: rank 0's
  /health stays 503 (the trap of SGLang across Sparks: SGLANG_HOST_IP not the fabric address).
- With NCCL_DEBUG=INFO each rank prints NCCL 2.28.9's INIT/NET lines for its own environment (NCCL_SOCKET_IFNAME's
  interfaces, NCCL_IB_HCA's RoCE devices that are Up, the network and transport chosen), as all_reduce_perf does.
- Rank 0 serves HTTP on --host:--port from the start: /health and /health_generate (503 while loading for
  SPARKCTL_LAB_SERVE_DELAY s, default 1, or once a rank stopped answering: a one-step round trip), /v1/models,
  /get_model_info, /get_server_info, /version, /generate, /v1/chat/completions and /v1/completions (stream: true
  too, SSE as OpenAI's), each decoding step a round trip to every other rank (SPARKCTL_LAB_MPI_TIMEOUT s, default
  20), a speculative step accepting 1 to num-draft-tokens tokens; /metrics only with --enable-metrics (the release's
  `sglang:` names). Ranks >= 1 serve SGLang's dummy /health once loaded. Logs go where SGLang's do (stderr; NCCL's to
  stdout), `The server is fired up and ready to roll!` when ready. TERM ends it: exit 0.
"""

import argparse
import contextlib
import errno
import fcntl
import glob
import hashlib
import http
import json
import operator
import os
import queue
import random
import re
import signal
import socket
import struct
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSION = os.environ.get("SPARKCTL_LAB_SGLANG_VERSION", "0.5.8")
RELEASES_PATH = os.environ.get("SPARKCTL_LAB_SGLANG_RELEASES", "/opt/sparkctl-lab/sglang_releases.json")
SERVE_DELAY = float(os.environ.get("SPARKCTL_LAB_SERVE_DELAY", "1"))
PEER_TIMEOUT = float(os.environ.get("SPARKCTL_LAB_MPI_TIMEOUT", "20"))
RETRY_SAY_EVERY = 10.0  # torch's store client, while it cannot connect
RECONNECT_EVERY = 0.2   # ZMQ's reconnect interval (100 ms), near enough
GPUS_PER_NODE = 1       # a DGX Spark's GB10
MAX_TOTAL_TOKENS = 131072  # the KV cache "allocated"
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)  # SGLang's default
LIB_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELD: list = []  # connections kept open for the life of the world (the queue's readers)


# --- the release ------------------------------------------------------------------------------------------------------
def version_key(text):
    """SGLang's tag order: 0.5.3 < 0.5.3.post1 < 0.5.4 (post -1: not a post release)."""
    m = re.match(r"^v?(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?", text)
    return (int(m[1]), int(m[2]), int(m[3]), int(m[4]) if m[4] else -1) if m else (0, 0, 0, -1)


def release():
    """The release's data, else the nearest earlier release's (else the earliest), as sparkctl judges it."""
    with open(RELEASES_PATH) as handle:
        releases = json.load(handle)["releases"]
    known = sorted(releases, key=version_key)
    older = [v for v in known if version_key(v) <= version_key(VERSION)]
    return releases[older[-1] if older else known[0]]


class Fatal(Exception):
    """An exception the server raises while starting: Python's traceback, ending in its line, on stderr; exit 1.
    `at` is where the release raises it (`python/sglang/srt/server_args.py:2120 ServerArgs._handle_...`)."""

    def __init__(self, line, at=None, source=None):
        super().__init__(line)
        self.line, self.at, self.source = line, at, source

    def traceback(self):
        out = ["Traceback (most recent call last):", f'  File "{os.path.abspath(__file__)}", line 11, in <module>',
               "    server_args = prepare_server_args(sys.argv[1:])"]
        if self.at:
            path, _, rest = self.at.partition(":")
            line, _, function = rest.partition(" ")
            out.append(f'  File "{os.path.join(LIB_ROOT, path.removeprefix("python/"))}", line {line}, in '
                       f'{function.rpartition(".")[2]}')
            if self.source:
                out.append(f"    {self.source}")
        return "\n".join(out + [self.line])


def log(message, rank=None):
    """SGLang's logging format, on stderr: `[2026-02-01 12:00:00 TP0] message` (a scheduler says its TP rank)."""
    where = f" TP{rank}" if rank is not None else ""
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{where}] {message}", file=sys.stderr, flush=True)


# --- the command line: argparse, built from the release's flags -------------------------------------------------------
class Refused(argparse.Action):
    """SGLang's DeprecatedAction of the releases that refuse the flag: it parses, then raises its ValueError."""

    def __init__(self, option_strings, dest, nargs=0, **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        raise Fatal(self.const)


class RefusedByParser(Refused):
    """0.5.18's DeprecatedAction given an error_message: `parser.error(message)`, argparse's usage and exit 2."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(self.const)


class Deprecated(argparse.Action):
    """SGLang's DeprecatedAction of the releases that only warn: an on/off flag that says it is going."""

    def __init__(self, option_strings, dest, nargs=0, **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        log(f"The command line argument '{option_string}' is deprecated and will be removed in future versions.")
        setattr(namespace, self.dest, True)


def named(name, convert, type_error=None):
    """A type= callable with the release's name (argparse says `invalid <name> value: ...`), or raising the release's
    own ArgumentTypeError message."""
    def call(text):
        try:
            return convert(text)
        except ValueError:
            if type_error:
                raise argparse.ArgumentTypeError(type_error.replace("{value}", text)) from None
            raise
    call.__name__ = name
    return call


def human_readable_int(pattern):
    """SGLang's human_readable_int: `32k`, `1.5Gi` or a plain int."""
    units = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}

    def convert(text):
        m = re.fullmatch(pattern, text.strip())
        return int(float(m[1]) * units[m[2]]) if m else int(text)
    return convert


def value_type(name, spec):
    converts = {"int": int, "float": float, "str": str, "loads": json.loads, "json_list_type": json.loads,
                "nullable_str": lambda text: None if not text or text == "None" else text}
    if name == "human_readable_int":
        return named(name, human_readable_int(spec["pattern"]), spec.get("type_error"))
    return named(name, converts.get(name, str), spec.get("type_error"))


def argument(spec):
    """add_argument's keywords for one flag as the release adds it."""
    kind = spec["kind"]
    if kind == "flag":
        return {"action": Deprecated} if spec.get("action") == "DeprecatedAction" else {"action": "store_true"}
    if kind == "bool":
        return {"action": argparse.BooleanOptionalAction}
    if kind == "refused" and spec.get("error") == "parser.error":
        return {"action": RefusedByParser, "const": spec.get("message", "")}
    if kind == "refused":
        return {"action": Refused, "const": f"{spec.get('error', 'ValueError')}: {spec.get('message', '')}"}
    name = spec.get("item", "str") if kind == "list" else spec.get("type") or kind
    out = {"type": value_type(name, spec)}
    for key in ("choices", "nargs", "required"):
        if spec.get(key) is not None:
            out[key] = spec[key]
    return out


def build_parser(data):
    """The release's parser: every flag with its aliases, in the release's order; defaults kept out (SUPPRESS) so
    that only what argv gives is parsed, the release's defaults filled in after."""
    parser = argparse.ArgumentParser(prog=data["parser"].get("prog"),
                                     allow_abbrev=data["parser"].get("allow_abbrev", True))
    for flag, spec in data["server_flags"].items():
        parser.add_argument(flag, *spec.get("aliases", []), dest=spec["dest"], default=argparse.SUPPRESS,
                            **argument(spec))
    return parser


def merge_config(parser, data, argv):
    """SGLang's ConfigArgumentMerger (python/sglang/srt/server_args_config_parser.py): `--config FILE` as two tokens,
    a YAML mapping of flag -> value turned into flags put before the command line's (which win)."""
    if not data["parser"].get("config") or "--config" not in argv:
        return argv
    at = [i for i, token in enumerate(argv) if token == "--config"]
    if len(at) > 1:
        raise Fatal("ValueError: Multiple config files specified! Only one allowed.")
    if at[0] == len(argv) - 1:
        raise Fatal("ValueError: No config file specified after --config flag!")
    path = argv[at[0] + 1]
    suffix = os.path.splitext(path)[1]
    if suffix.lower() not in (".yaml", ".yml"):
        raise Fatal(f"ValueError: Config file must be YAML format, got: {suffix}")
    if not os.path.exists(path):
        raise Fatal(f"ValueError: Config file not found: {path}")
    import yaml

    with open(path) as handle:
        config = yaml.safe_load(handle) or {}
    if not isinstance(config, dict):
        raise Fatal("ValueError: Config file must contain a dictionary at root level")
    return config_flags(parser, config) + argv[:at[0]] + argv[at[0] + 2:]


def config_flags(parser, config):
    store_true = {a.dest for a in parser._actions if isinstance(a, argparse._StoreTrueAction)}
    unsupported = {a.dest: a for a in parser._actions if a.option_strings and "--config" not in a.option_strings
                   and "-h" not in a.option_strings
                   and not isinstance(a, (argparse._StoreTrueAction, argparse._StoreAction))}
    out = []
    for key, value in config.items():
        norm = key.replace("-", "_")
        if norm in unsupported:
            raise Fatal(f"ValueError: Unsupported config option '{norm}' with action "
                        f"'{unsupported[norm].__class__.__name__}'")
        if isinstance(value, bool):
            out += ([f"--{key}"] if value else []) if norm in store_true else [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            out += [f"--{key}", *map(str, value)] if value else []
        else:
            out += [f"--{key}", str(value)]
    return out


def parse(data, argv):
    """ServerArgs' fields as the release's argparse reads argv (argparse's own refusals: exit 2), defaults filled in."""
    parser = build_parser(data)
    given = vars(parser.parse_args(merge_config(parser, data, argv)))
    return {spec["field"]: given.get(spec["dest"], spec.get("default"))
            for spec in data["server_flags"].values() if "field" in spec}


# --- what ServerArgs checks at start: the release's recorded checks, evaluated as Python would ------------------------
class Unknown:
    """A value the flags cannot say (a model's config, a device, an env var): a check that needs it does not stop."""

    def __repr__(self):
        return "UNKNOWN"


UNKNOWN = Unknown()
ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "%": operator.mod, "//": operator.floordiv,
              "/": operator.truediv}
COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
           ">=": operator.ge, "in": lambda a, b: a in b, "not in": lambda a, b: a not in b,
           "is": operator.is_, "is not": operator.is_not}


class PythonRaises(Exception):
    """Python raises a TypeError here (`None > 1`)."""


class Evaluation:
    """The recorded expression trees (sglang_releases.json: field, const, set, cond, and/or/not, cmp, bin, ...) over
    the fields, three-valued: what the flags cannot say is UNKNOWN, and so is anything that depends on it."""

    def __init__(self, values, assignments):
        self.values, self.assignments, self.done = values, assignments, {}

    def value(self, tree):
        head = tree[0]
        if head == "field":
            return self.values.get(tree[1], UNKNOWN)
        if head == "set":
            if tree[1] not in self.done:
                self.done[tree[1]] = self.value(self.assignments[tree[1]]["value"])
            return self.done[tree[1]]
        if head == "cond":
            test = self.value(tree[1])
            if test is UNKNOWN:
                new, old = self.value(tree[2]), self.value(tree[3])
                return new if new is not UNKNOWN and new == old else UNKNOWN
            return self.value(tree[2] if test else tree[3])
        if head == "const":
            return tree[1]
        if head == "tuple":
            items = [self.value(t) for t in tree[1:]]
            return UNKNOWN if UNKNOWN in items else tuple(items)
        if head in ("and", "or"):
            return self.boolean(head, tree[1:])
        if head == "not":
            inner = self.value(tree[1])
            return UNKNOWN if inner is UNKNOWN else not inner
        if head in ("cmp", "bin"):
            return self.operation(head, tree[1], self.value(tree[2]), self.value(tree[3]))
        if head in ("upper", "lower"):
            inner = self.value(tree[1])
            return getattr(inner, head)() if isinstance(inner, str) else UNKNOWN
        if head == "startswith":
            inner, prefix = self.value(tree[1]), self.value(tree[2])
            return inner.startswith(prefix) if isinstance(inner, str) and isinstance(prefix, str) else UNKNOWN
        return UNKNOWN  # opaque: a call, a local, an env var

    def boolean(self, op, trees):
        """Short-circuit as Python does; past an UNKNOWN operand a TypeError is not certain."""
        result = op == "and"
        for tree in trees:
            try:
                value = self.value(tree)
            except PythonRaises:
                if result is UNKNOWN:
                    return UNKNOWN
                raise
            if value is UNKNOWN:
                result = UNKNOWN
            elif (op == "and") != bool(value):
                return value
            elif result is not UNKNOWN:
                result = value
        return result

    @staticmethod
    def operation(head, op, left, right):
        if UNKNOWN in (left, right) and not (op in ("is", "is not") and right is None and left is not UNKNOWN):
            return UNKNOWN
        if head == "cmp" and op in ("<", "<=", ">", ">=") and (left is None or right is None):
            raise PythonRaises(f"'{op}' not supported between instances of '{type(left).__name__}' and "
                               f"'{type(right).__name__}'")
        if head == "bin" and (left is None or right is None):
            raise PythonRaises(f"unsupported operand type(s) for {op}: '{type(left).__name__}' and "
                               f"'{type(right).__name__}'")
        try:
            return (COMPARE if head == "cmp" else ARITHMETIC)[op](left, right)
        except (TypeError, ZeroDivisionError):
            return UNKNOWN


def first_stop(values, checks, assignments):
    """Raise what the release raises at the first of its recorded checks these values fail."""
    evaluation = Evaluation(values, assignments)
    for check in checks:
        try:
            failed = fails(evaluation, check)
        except PythonRaises as error:
            raise Fatal(f"TypeError: {error}", check["at"], check.get("source")) from None
        if failed:
            message = re.sub(r"\{self\.(\w+)\}", lambda m: str(values.get(m[1])), check["message"])
            raise Fatal(f"{check['error']}: {message}" if message else check["error"], check["at"], check.get("source"))


def fails(evaluation, check):
    for test in check["when"]:
        value = evaluation.value(test)
        if value is UNKNOWN or not value:
            return False
    if check["kind"] == "raise":
        return True
    value = evaluation.value(check["test"])
    return check["kind"] == "assert" and value is not UNKNOWN and not value


def check_speculative(data, values):
    """ServerArgs._handle_speculative_decoding: an algorithm the release does not know (a free string from 0.5.12;
    argparse's choices before), then its recorded checks."""
    spec = data["speculative"]
    algorithm = values.get("speculative_algorithm")
    if algorithm is None:
        return
    name = str(algorithm) if spec.get("case_sensitive", True) else str(algorithm).upper()
    if name not in spec["algorithms"] and name not in spec.get("aliases", {}):
        message = spec.get("unknown_message", "Unknown speculative algorithm name: {name}").replace("{name}", algorithm)
        raise Fatal(f"{spec.get('unknown_error', 'ValueError')}: {message}")
    values["speculative_algorithm"] = spec.get("aliases", {}).get(name, name)
    first_stop(values, spec["checks"], spec.get("assignments", []))


def check_world(data, values):
    """ServerArgs.check_server_args' multi-node asserts; then one GPU per Spark: a node's ranks beyond its GPUs
    fail when their scheduler takes its device."""
    first_stop(values, data["multi_node"]["checks"], data["multi_node"].get("assignments", []))
    per_node = values["tp_size"] * values["pp_size"] // max(1, values["nnodes"])
    last_gpu = int(values.get("base_gpu_id") or 0) + (per_node - 1) * int(values.get("gpu_id_step") or 1)
    if last_gpu >= GPUS_PER_NODE:
        raise Fatal("RuntimeError: CUDA error: invalid device ordinal")


# --- the model and the draft ------------------------------------------------------------------------------------------
def hub_cache():
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    return os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")


def resolve_model(name, revision=None):
    """The model's directory as transformers finds it offline: a local dir with config.json, or the snapshot a repo
    id's ref names in the Hugging Face cache; else transformers' OSError."""
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise Fatal(f"OSError: {name} does not appear to have a file named config.json. Checkout "
                        f"'https://huggingface.co/{name}/tree/{revision}' for available files.")
        return name
    if not re.fullmatch(r"(?:[\w\-.]+/)?[\w\-.]+", name) or "--" in name or ".." in name:
        raise Fatal(f"OSError: Incorrect path_or_model_id: '{name}'. Please provide either the path to a local "
                    "folder or the repo_id of a model on the Hub.")
    repo = os.path.join(hub_cache(), "models--" + name.replace("/", "--"))
    ref = revision or "main"
    try:
        if re.fullmatch(r"[0-9a-f]{40}", ref):
            commit = ref
        else:
            with open(os.path.join(repo, "refs", ref)) as handle:
                commit = handle.read().strip()
        path = os.path.join(repo, "snapshots", commit)
    except OSError:
        path = None
    if path is None or not os.path.isfile(os.path.join(path, "config.json")):
        raise Fatal("OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find "
                    f"them in the cached files: no config.json for {name} in {repo}.\nCheck your internet connection "
                    "or see how to run the library in offline mode at "
                    "'https://huggingface.co/docs/transformers/installation#offline-mode'.")
    return path


def model_config(path):
    try:
        with open(os.path.join(path, "config.json")) as handle:
            config = json.load(handle)
    except (OSError, ValueError) as error:
        raise Fatal(f"OSError: It looks like the config file at '{path}/config.json' is not a valid JSON file.") \
            from error
    return config if isinstance(config, dict) else {}


def context_length(values, config):
    """ModelConfig's context length: the model's own (its config's first length key, else 2048), or a user's not
    beyond it unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN."""
    keys = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
    derived = next((int(config[k]) for k in keys if isinstance(config.get(k), int)), 2048)
    wanted = values.get("context_length")
    if wanted is None:
        return derived
    allowed = os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "").lower() in ("1", "true", "yes", "y")
    if wanted > derived and not allowed:
        raise Fatal(f"ValueError: User-specified context_length ({wanted}) is greater than the derived context_length "
                    f"({derived}). This may lead to incorrect model outputs or CUDA errors. Note that the derived "
                    "context_length may differ from max_position_embeddings in the model's config. To allow "
                    "overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
    return wanted


def check_weights(name, path):
    """DefaultModelLoader._prepare_weights: some weight files, or SGLang's RuntimeError."""
    if not any(glob.glob(os.path.join(path, pattern)) for pattern in ("*.safetensors", "*.bin", "*.pt")):
        raise Fatal(f"RuntimeError: Cannot find any model weights with `{name}`")


# --- this node's addresses --------------------------------------------------------------------------------------------
def ipv4(netdev):
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        return socket.inet_ntoa(fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", netdev.encode()[:15]))[20:24])
    except OSError:
        return None
    finally:
        probe.close()


def own_addresses():
    """The IPv4 addresses assigned to this network namespace's interfaces (the kernel's `/32 host LOCAL` entries);
    None when the kernel does not say."""
    try:
        with open("/proc/net/fib_trie") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    found, last = [], None
    for line in (x.strip() for x in lines):
        if line.startswith("|--"):
            last = line[3:].strip()
        elif line.startswith("/32 host LOCAL") and last and last not in found:
            found.append(last)
    return found


def is_own(host):
    """Whether the kernel delivers `host` here (it lets a socket bind to it): where torch's store client, connecting
    to --dist-init-addr, finds the store rank 0 listens for on every address."""
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return False
    with socket.socket() as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def default_route_interface():
    try:
        with open("/proc/net/route") as handle:
            rows = [line.split() for line in handle.read().splitlines()[1:]]
    except OSError:
        return None
    return next((row[0] for row in rows if len(row) > 7 and row[1] == "00000000" and row[7] == "00000000"), None)


def advertised_address(data):
    """get_local_ip_auto: SGLANG_HOST_IP, else HOST_IP, else SGLANG_LOCAL_IP_NIC's address (the releases that read
    it), else the address the default route leaves from (a lab node has none: its first non-loopback address)."""
    chosen = os.environ.get("SGLANG_HOST_IP") or os.environ.get("HOST_IP")
    if chosen:
        return chosen
    nic = os.environ.get("SGLANG_LOCAL_IP_NIC")
    if nic and "SGLANG_LOCAL_IP_NIC" in data.get("env", ()):
        address = ipv4(nic) if nic in (n for _, n in socket.if_nameindex()) else None
        if address and address not in ("127.0.0.1", "0.0.0.0"):
            return address
        log("You must specify a valid interface name. Can not get local ip from NIC. Please verify whether "
            "SGLANG_LOCAL_IP_NIC is set correctly.")
    route = default_route_interface()
    if route and (address := ipv4(route)):
        return address
    for _, netdev in socket.if_nameindex():
        address = ipv4(netdev)
        if address and not address.startswith("127."):
            return address
    raise Fatal("ValueError: Can not get local ip")


# --- NCCL's INIT/NET lines (the lab's all_reduce_perf prints the same; the stand-ins share no module) -----------------
SPARK_ROCE_DEVICES = [("rocep1s0f0", "enp1s0f0np0"), ("roceP2p1s0f0", "enP2p1s0f0np0"),
                      ("rocep1s0f1", "enp1s0f1np1"), ("roceP2p1s0f1", "enP2p1s0f1np1")]


def up(netdev):
    try:
        with open(f"/sys/class/net/{netdev}/operstate") as handle:
            return handle.read().strip() == "up"
    except OSError:
        return False


def selected(spec, names):
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    entries = [e.split(":")[0] for e in spec.lstrip("=").split(",") if e]
    return [n for n in names if (not entries or any(n == e if exact else n.startswith(e) for e in entries)) != exclude]


def nccl_lines(rank, world):
    """NCCL 2.28.9's INIT/NET lines for this rank's environment: the RoCE devices of NCCL_IB_HCA on Up twins, else
    `NET/IB : No device found.` and the Socket fallback over NCCL_SOCKET_IFNAME's interfaces; the channel to the
    next rank."""
    env = os.environ
    prefix = f"{socket.gethostname()}:{os.getpid()}:{os.getpid()} [0] NCCL INFO"
    out = [f"{prefix} NCCL version 2.28.9+cuda13.0"] if rank == 0 else []
    for key in ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_DISABLE", "NCCL_IB_GID_INDEX"):
        if env.get(key):
            out.append(f"{prefix} {key} set by environment to {env[key]}")
    netdevs = [n for _, n in socket.if_nameindex()]
    sockets = [(n, ip) for n in selected(env.get("NCCL_SOCKET_IFNAME", "^docker,lo"), netdevs) if (ip := ipv4(n))]
    oob = f"{sockets[0][0]}:{sockets[0][1]}<0>" if sockets else "lo:127.0.0.1<0>"
    present = [(dev, nd) for dev, nd in SPARK_ROCE_DEVICES if os.path.isdir(f"/sys/class/net/{nd}") and up(nd)]
    devices = [] if env.get("NCCL_IB_DISABLE") == "1" else \
        [(dev, nd) for dev, nd in present if dev in selected(env.get("NCCL_IB_HCA", ""), [d for d, _ in present])]
    if devices:
        listed = " ".join(f"[{i}]{dev}:1/RoCE" for i, (dev, _) in enumerate(devices))
        out += [f"{prefix} NET/IB : Using {listed} [RO]; OOB {oob}", f"{prefix} Initialized NET plugin IB",
                f"{prefix} Using network IB"]
    else:
        used = " ".join(f"[{i}]{n}:{ip}<0>" for i, (n, ip) in enumerate(sockets)) or "[0]lo:127.0.0.1<0>"
        out += [f"{prefix} NET/IB : No device found.", f"{prefix} NET/IB : Using [RO]; OOB {oob}",
                f"{prefix} Failed to initialize NET plugin IB", f"{prefix} NET/Socket : Using {used}",
                f"{prefix} Initialized NET plugin Socket", f"{prefix} Using network Socket"]
    via = "NET/IB/0" if devices else "NET/Socket/0"
    return out + [f"{prefix} Channel 00/0 : {rank}[0] -> {(rank + 1) % world}[0] [send] via {via}"]


def nccl_startup(rank, world):
    """The TP group's communicator comes up: NCCL prints to stdout with NCCL_DEBUG=INFO."""
    if os.environ.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE"):
        print("\n".join(nccl_lines(rank, world)), flush=True)


# --- the ranks meet: torch's TCP store at --dist-init-addr, then the message queue ------------------------------------
class Line:
    """JSON messages, one a line, over a TCP connection."""

    def __init__(self, sock):
        self.sock, self.reader = sock, sock.makefile("rb")

    def send(self, message):
        self.sock.sendall((json.dumps(message) + "\n").encode())

    def receive(self):
        data = self.reader.readline()
        if not data:
            raise ConnectionError("Connection closed by peer")
        return json.loads(data)


def split_addr(text):
    """--dist-init-addr as torch's tcp:// rendezvous reads it."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise Fatal("ValueError: Error initializing torch.distributed using tcp:// rendezvous: port number missing")
    return host.strip("[]"), int(port)


def say_unreachable(host, port, number):
    """torch's store client, while it cannot connect (torch/csrc/distributed/c10d/socket.cpp)."""
    print(f"[W socket.cpp] The client socket has failed to connect to [{host}]:{port} (errno: {number} - "
          f"{os.strerror(number)}).", file=sys.stderr, flush=True)


def store_client(host, port, hello):
    """torch's store client: connect for as long as it takes, saying so every 10 s; a store that closes on it before
    the world is formed (its server restarted) is tried again."""
    said = None
    while True:
        try:
            conn = Line(socket.create_connection((host, port), timeout=5))
            conn.sock.settimeout(None)
            conn.send(hello)
            return conn, conn.receive()
        except (OSError, ValueError) as error:
            if said is None or time.monotonic() - said >= RETRY_SAY_EVERY:
                timed_out = isinstance(error, socket.timeout)
                say_unreachable(host, port, getattr(error, "errno", None) or
                                (errno.ETIMEDOUT if timed_out else errno.ECONNRESET))
                said = time.monotonic()
            time.sleep(1)


def store_server(port):
    """torch's TCPStore server on rank 0: the port on every address."""
    try:
        return socket.create_server(("", port))
    except OSError as error:
        raise Fatal("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
                    f"address. port: {port}, useIpv6: false, code: -{error.errno}, name: "
                    f"{errno.errorcode.get(error.errno, '?')}, message: {(error.strerror or '').lower()}") from error


def meet_as_rank0(host, port, nnodes, hello):
    """The store: every other rank joins (its rank and advertised address); its own client must reach it at H."""
    listener = store_server(port)
    if not is_own(host):  # its own client goes where H is, and never finds this store there
        store_client(host, port, {"rank": 0})
        hang()
    joined = {}
    while len(joined) < nnodes - 1:
        sock, _ = listener.accept()
        try:
            sock.settimeout(5)
            conn = Line(sock)
            said = conn.receive()
            sock.settimeout(None)
        except (OSError, ValueError):
            sock.close()
            continue
        rank = said.get("rank")
        if not isinstance(rank, int) or not 0 < rank < nnodes:
            sock.close()
            continue
        if rank in joined:  # the rank started again: its earlier connection is a dead one
            joined[rank][0].sock.close()
        joined[rank] = (conn, said)
    for conn, _ in joined.values():
        with contextlib.suppress(OSError):  # gone since it joined: rank 0 finds out at its first step
            conn.send(hello)
    threading.Thread(target=hold_late_clients, args=(listener,), daemon=True).start()
    return {rank: said.get("host_ip") for rank, (_, said) in joined.items()}, [c for c, _ in joined.values()]


def hold_late_clients(listener):
    """The store lives as long as the world: a rank that comes late connects and waits for keys that never come (a
    probe of the port, doctor's, connects and leaves)."""
    while True:
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=held_until_closed, args=(sock,), daemon=True).start()


def held_until_closed(sock):
    with contextlib.suppress(OSError):
        while sock.recv(4096):
            pass
    sock.close()


def mq_listeners(port):
    """The message queue's socket, bound on every address this rank owns: a connection to an address it does not
    own is refused."""
    out = []
    for address in own_addresses() or [""]:
        try:
            out.append(socket.create_server((address, port)))
        except OSError as error:
            if error.errno == errno.EADDRNOTAVAIL:
                continue
            raise Fatal(f"zmq.error.ZMQError: {error.strerror} (addr='tcp://{address or '*'}:{port}')") from error
    return out


def accept_into(listeners, inbox):
    for listener in listeners:
        threading.Thread(target=accepting, args=(listener, inbox), daemon=True).start()


def accepting(listener, inbox):
    while True:
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        try:
            sock.settimeout(5)
            conn = Line(sock)
            said = conn.receive()
            sock.settimeout(None)
        except (OSError, ValueError):
            sock.close()
            continue
        inbox.put((said.get("rank"), conn))


def connect_quietly(host, port, rank):
    """ZMQ's connect: it never fails, it retries until the peer is there; nothing said."""
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=5)
            conn = Line(sock)
            conn.send({"rank": rank})
            return conn
        except OSError:
            time.sleep(RECONNECT_EVERY)


def mq_rank0(port, peers):
    """Rank 0's side of the queue: it connects to each rank at the address that rank advertised, and waits for each
    rank's connection at its own; returns the connections it steps the ranks over."""
    inbox = queue.Queue()
    accept_into(mq_listeners(port + 1), inbox)
    out = {rank: connect_quietly(address, port + 1 + rank, 0) for rank, address in sorted(peers.items())}
    for conn in out.values():
        conn.sock.settimeout(PEER_TIMEOUT)
    arrived = set()
    while arrived != set(peers):
        rank, conn = inbox.get()
        HELD.append(conn)
        arrived.add(rank)
    return [out[rank] for rank in sorted(out)]


def mq_worker(port, rank, rank0_address):
    """A rank's side: it connects to rank 0's advertised address and waits for rank 0's connection at its own."""
    inbox = queue.Queue()
    accept_into(mq_listeners(port + 1 + rank), inbox)
    to_rank0 = connect_quietly(rank0_address, port + 1, rank)
    while True:
        said, conn = inbox.get()
        if said == 0:
            return conn, to_rank0


def hang():
    """A rank that waits for a peer that never comes: as the real one, until it is stopped."""
    while True:
        signal.pause()


# --- the engine: rank 0's scheduler, each step a round trip to every other rank ---------------------------------------
class Engine:
    def __init__(self, peers, model, values, names):
        self.peers, self.model, self.values, self.names = peers, model, values, names
        self.lock = threading.Lock()
        self.broken = False
        self.draft = draft_tokens(values)
        self.running = self.waiting = 0
        self.counts = {"prompt": 0, "generation": 0, "requests": 0, "steps": 0, "spec_steps": 0, "accepted": 0}
        self.ttft, self.in_cache = [], 0
        self.window = [time.monotonic(), 0, 0]  # decode-log window: started, steps, tokens
        self.throughput = 0.0

    def step(self, n):
        for conn in self.peers:
            try:
                conn.send({"step": n})
                conn.receive()
            except (OSError, ValueError):
                self.broken = True
                raise

    def alive(self):
        """SGLang's /health: a request producing tokens, or a one-step round trip to every rank answering."""
        if self.broken:
            return False
        if not self.lock.acquire(timeout=0.05):
            return True
        try:
            self.step(-1)
            return True
        except (OSError, ValueError):
            return False
        finally:
            self.lock.release()

    def generate(self, prompt, max_tokens):
        """The tokens of one request, step by step (a speculative step accepting 1 to num-draft-tokens)."""
        words = [w.strip(".,;:!?\"'()").lower() for w in prompt.split()]
        vocabulary = [w for w in words if w.isalpha()] + ["spark", "fabric", "tensor", "node", "cluster", "token"]
        started = time.monotonic()
        self.waiting += 1
        with self.lock:
            self.waiting -= 1
            self.running += 1
            self.in_cache = len(words)
            log(f"Prefill batch, #new-seq: 1, #new-token: {len(words)}, #cached-token: 0, token usage: "
                f"{self.usage():.2f}, #running-req: 0, #queue-req: {self.waiting},", 0)
            produced, n = 0, 0
            try:
                while produced < max_tokens:
                    self.step(n)
                    digest = hashlib.sha256(f"{prompt}\0{n}".encode()).digest()
                    take = min(max_tokens - produced, 1 + digest[0] % self.draft if n and self.draft else 1)
                    if n == 0:
                        self.ttft.append(time.monotonic() - started)
                    text = "".join(("" if produced + i == 0 else " ") + vocabulary[digest[1 + i % 31] % len(vocabulary)]
                                   for i in range(take))
                    produced += take
                    self.note_step(n, take)
                    n += 1
                    yield text
            finally:
                self.running -= 1
                self.in_cache = 0
                self.counts["requests"] += 1
                self.counts["prompt"] += len(words)
                self.counts["generation"] += produced

    def usage(self):
        return self.in_cache / MAX_TOTAL_TOKENS

    def note_step(self, n, tokens):
        """One decoding step's figures, and SGLang's decode log line every --decode-log-interval steps."""
        self.in_cache += tokens
        if n and self.draft:
            self.counts["spec_steps"] += 1
            self.counts["accepted"] += tokens
        self.window[1] += 1
        self.window[2] += tokens
        if self.window[1] >= int(self.values.get("decode_log_interval") or 40):
            self.throughput = self.window[2] / max(1e-6, time.monotonic() - self.window[0])
            accept = f"accept len: {self.accept_length():.2f}, " if self.draft else ""
            log(f"Decode batch, #running-req: {self.running}, #token: {self.in_cache}, token usage: "
                f"{self.usage():.2f}, {accept}cuda graph: True, gen throughput (token/s): {self.throughput:.2f}, "
                f"#queue-req: {self.waiting},", 0)
            self.window = [time.monotonic(), 0, 0]

    def accept_length(self):
        return self.counts["accepted"] / self.counts["spec_steps"] if self.counts["spec_steps"] else 1.0

    def metrics(self):
        """Prometheus text (prometheus_client's 0.0.4 exposition) with the release's `sglang:` names only: the
        scheduler's gauges, the tokenizer's counters and time-to-first-token histogram."""
        model = f'model_name="{self.model}"'
        scheduler = f'{{engine_type="unified",{model},pp_rank="0",tp_rank="0"}}'
        gauges = {"sglang:num_running_reqs": self.running, "sglang:num_queue_reqs": self.waiting,
                  "sglang:token_usage": self.usage(), "sglang:gen_throughput": self.throughput,
                  "sglang:cache_hit_rate": 0.0, "sglang:max_total_num_tokens": MAX_TOTAL_TOKENS}
        if self.draft:
            gauges["sglang:spec_accept_length"] = self.accept_length()
        counters = {"sglang:prompt_tokens_total": self.counts["prompt"],
                    "sglang:generation_tokens_total": self.counts["generation"],
                    "sglang:num_requests_total": self.counts["requests"]}
        out = []
        for name, value in gauges.items():
            if self.names.get(name) == "gauge":
                out += [f"# HELP {name} {name[7:]}", f"# TYPE {name} gauge", f"{name}{scheduler} {float(value)}"]
        for name, value in counters.items():
            if self.names.get(name) == "counter":
                out += [f"# HELP {name} {name[7:]}", f"# TYPE {name} counter", f"{name}{{{model}}} {float(value)}"]
        return "\n".join(out + self.ttft_histogram(model)) + "\n"

    def ttft_histogram(self, model):
        name = "sglang:time_to_first_token_seconds"
        if self.names.get(name) != "histogram":
            return []
        bounds = self.values.get("bucket_time_to_first_token") or TTFT_BUCKETS
        out = [f"# HELP {name} Histogram of time to first token in seconds.", f"# TYPE {name} histogram"]
        for bound in [*bounds, "+Inf"]:
            count = len(self.ttft) if bound == "+Inf" else sum(1 for t in self.ttft if t <= bound)
            out.append(f'{name}_bucket{{{model},le="{float(bound) if bound != "+Inf" else bound}"}} {float(count)}')
        return out + [f"{name}_count{{{model}}} {float(len(self.ttft))}", f"{name}_sum{{{model}}} {sum(self.ttft)}"]


def draft_tokens(values):
    """The tokens a speculative step proposes (num-draft-tokens, else num-steps + 1, else SGLang's choice, 4)."""
    if not values.get("speculative_algorithm"):
        return 0
    drafted = values.get("speculative_num_draft_tokens")
    if drafted is None and values.get("speculative_num_steps") is not None:
        drafted = values["speculative_num_steps"] + 1
    return max(1, int(drafted or 4))


# --- HTTP -------------------------------------------------------------------------------------------------------------
class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, engine=None, info=None):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)
        self.engine, self.info, self.ready = engine, info or {}, False

    def healthy(self):
        return self.engine is None or (self.ready and self.engine.alive())


def http_server(values, engine=None, info=None):
    """Uvicorn on --host:--port, in its own thread; a port taken is uvicorn's error."""
    host, port = values.get("host") or "127.0.0.1", int(values.get("port") or 30000)
    try:
        server = Server((host, port), engine, info)
    except OSError as error:
        raise Fatal(f"OSError: [Errno {error.errno}] error while attempting to bind on address ('{host}', {port}): "
                    f"{(error.strerror or '').lower()}") from error
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for line in (f"Started server process [{os.getpid()}]", "Waiting for application startup.",
                 "Application startup complete.", f"Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)"):
        log(f"INFO:     {line}")
    return server


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, fmt, *args):
        """Uvicorn's access log line (`"GET /health HTTP/1.1" 200 OK`); anything else as it comes."""
        if fmt.startswith('"%s" %s') and len(args) > 1 and str(args[1]).isdigit():
            phrase = http.HTTPStatus(int(args[1])).phrase
            return log(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" '
                       f'{args[1]} {phrase}')
        return log(f"INFO:     {fmt % args}")

    def send_body(self, status, data, kind="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_json(self, status, payload):
        self.send_body(status, json.dumps(payload).encode())

    def error(self, status, message):
        kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}.get(status, "Error")
        self.send_json(status, {"object": "error", "message": message, "type": kind, "param": None, "code": status})

    def do_GET(self):
        server = self.server
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            return self.send_body(200 if server.healthy() else 503, b"", "text/plain")
        if server.engine is None:  # a rank >= 1: SGLang's dummy health-check server (its /metrics: nothing here)
            found = path == "/metrics" and server.info.get("enable_metrics")
            return self.send_body(200, b"", "text/plain; version=0.0.4") if found else \
                self.send_json(404, {"detail": "Not Found"})
        answers = {"/v1/models": self.models, "/get_model_info": lambda: server.info["model_info"],
                   "/get_server_info": self.server_info, "/version": lambda: {"version": VERSION}}
        if path in answers:
            return self.send_json(200, answers[path]())
        if path == "/metrics" and server.engine.values.get("enable_metrics"):
            return self.send_body(200, server.engine.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        return self.send_json(404, {"detail": "Not Found"})

    def models(self):
        name = self.server.engine.model
        return {"object": "list", "data": [{"id": name, "object": "model", "created": int(time.time()),
                                            "owned_by": "sglang", "root": name,
                                            "max_model_len": self.server.info["context_len"]}]}

    def server_info(self):
        engine = self.server.engine
        state = {"avg_spec_accept_length": engine.accept_length() if engine.draft else None,
                 "last_gen_throughput": engine.throughput, "memory_usage": {"token_capacity": MAX_TOTAL_TOKENS}}
        return {**engine.values, "version": VERSION, "internal_states": [state]}

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        if self.server.engine is None or path not in ("/v1/chat/completions", "/v1/completions", "/generate"):
            return self.send_json(404, {"detail": "Not Found"})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        except ValueError:
            return self.error(400, "Invalid JSON body")
        if not self.server.healthy():
            return self.error(503, "The server is not ready")
        if path == "/generate":
            return self.native(body)
        return self.openai(body, chat=path == "/v1/chat/completions")

    def prompt_of(self, body, chat):
        if chat:
            return " ".join(str(m.get("content", "")) for m in body.get("messages") or [] if isinstance(m, dict))
        prompt = body.get("prompt", "")
        return " ".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)

    def openai(self, body, chat):
        prompt = self.prompt_of(body, chat)
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        context = self.server.info["context_len"]
        if len(prompt.split()) + max_tokens > context:
            return self.error(400, f"Requested token count exceeds the model's maximum context length of {context} "
                                   f"tokens. You requested a total of {len(prompt.split()) + max_tokens} tokens: "
                                   f"{len(prompt.split())} tokens from the input messages and {max_tokens} tokens "
                                   "for the completion. Please reduce the number of tokens in the input messages or "
                                   "the completion to fit within the limit.")
        reply = {"id": uuid.uuid4().hex, "created": int(time.time()), "model": body.get("model") or
                 self.server.engine.model}
        tokens = self.server.engine.generate(prompt, max_tokens)
        if body.get("stream"):
            return self.stream(reply, tokens, chat)
        try:
            text = "".join(tokens)
        except (OSError, ValueError):
            return self.error(503, "a rank stopped answering")
        choice = {"index": 0, "finish_reason": "length", "matched_stop": None,
                  **({"message": {"role": "assistant", "content": text, "reasoning_content": None,
                                  "tool_calls": None}} if chat else {"text": text, "logprobs": None})}
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": max_tokens,
                 "total_tokens": len(prompt.split()) + max_tokens}
        return self.send_json(200, {**reply, "object": "chat.completion" if chat else "text_completion",
                                    "choices": [choice], "usage": usage})

    def stream(self, reply, tokens, chat):
        """Server-sent events as OpenAI's: a chunk a step, `data: [DONE]` last, the connection closed after it."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        kind = "chat.completion.chunk" if chat else "text_completion"
        first = chat
        try:
            for text in tokens:
                delta = {"role": "assistant", "content": text} if first else {"content": text}
                first = False
                choice = {"index": 0, "delta": delta, "finish_reason": None} if chat else \
                    {"index": 0, "text": text, "finish_reason": None}
                self.event({**reply, "object": kind, "choices": [choice]})
            last = {"index": 0, "delta": {}, "finish_reason": "length"} if chat else \
                {"index": 0, "text": "", "finish_reason": "length"}
            self.event({**reply, "object": kind, "choices": [last]})
            self.wfile.write(b"data: [DONE]\n\n")
        except (OSError, ValueError):
            self.close_connection = True  # a rank stopped answering, or the client left: the stream just ends

    def event(self, payload):
        self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
        self.wfile.flush()

    def native(self, body):
        """SGLang's own /generate (what its warm-up sends)."""
        params = body.get("sampling_params") or {}
        prompt = str(body.get("text", ""))
        max_tokens = int(params.get("max_new_tokens") or 128)
        try:
            text = "".join(self.server.engine.generate(prompt, max_tokens))
        except (OSError, ValueError):
            return self.error(503, "a rank stopped answering")
        meta = {"id": uuid.uuid4().hex, "finish_reason": {"type": "length", "length": max_tokens},
                "prompt_tokens": len(prompt.split()), "completion_tokens": max_tokens, "cached_tokens": 0}
        return self.send_json(200, {"text": text, "meta_info": meta})


# --- the ranks --------------------------------------------------------------------------------------------------------
def loaded(values, model, draft, rank):
    """Weights load after the world formed (SPARKCTL_LAB_SERVE_DELAY s), the draft's after the target's."""
    log("Load weight begin. avail mem=119.50 GB", rank)
    check_weights(values["model_path"], model)
    time.sleep(SERVE_DELAY)
    if draft:
        check_weights(values["speculative_draft_model_path"], draft)
    kind = (model_config(model).get("architectures") or ["?"])[0]
    log(f"Load weight end. type={kind}, dtype=torch.bfloat16, avail mem=119.00 GB, mem usage=0.50 GB.", rank)
    log(f"KV Cache is allocated. #tokens: {MAX_TOTAL_TOKENS}", rank)


def serve_rank0(values, peers, model, draft, info, server):
    """Rank 0's engine behind the already-listening HTTP server: loaded, warmed up (a round trip to every rank),
    then ready."""
    loaded(values, model, draft, 0)
    log(f"max_total_num_tokens={MAX_TOTAL_TOKENS}, chunked_prefill_size={values.get('chunked_prefill_size')}, "
        f"max_running_requests={values.get('max_running_requests')}, context_len={info['context_len']}", 0)
    server.engine.peers = peers
    try:  # SGLang's warm-up request: a rank gone by now ends the server
        for _ in server.engine.generate("The capital city of France is", 8):
            pass
    except (OSError, ValueError) as error:
        log(f"Initialization failed. warmup error: {error}")
        return 1
    server.ready = True
    log("The server is fired up and ready to roll!")
    hang()


def serve_worker(values, conn, model, draft, rank):
    """A rank >= 1: loaded, SGLang's dummy /health on its own --host:--port, then every step rank 0 asks."""
    loaded(values, model, draft, rank)
    http_server(values, info={"enable_metrics": values.get("enable_metrics")})
    while True:
        try:
            message = conn.receive()
            conn.send({"step": message.get("step")})
        except (OSError, ValueError) as error:
            log(f"Scheduler hit an exception: RuntimeError: {error}", rank)
            return 1


def start(data, argv):
    """The server's start: its flags, its start-up checks, the model; then one node alone, or a rank of a world."""
    if version_key(VERSION) >= (0, 5, 12, -1):  # python/sglang/launch_server.py at v0.5.12, before it parses
        print(f"{os.path.abspath(__file__)}:56: UserWarning: 'python -m sglang.launch_server' is still supported, "
              "but 'sglang serve' is the recommended entrypoint.\n  Example: sglang serve --model-path <model> "
              "[options]\n  warnings.warn(", file=sys.stderr, flush=True)
    values = parse(data, argv)
    model = resolve_model(values["model_path"], values.get("revision"))
    config = model_config(model)
    check_speculative(data, values)
    draft = None
    if values.get("speculative_draft_model_path"):
        draft = resolve_model(values["speculative_draft_model_path"], values.get("speculative_draft_model_revision"))
    check_world(data, values)
    log("server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in values.items()) + ")")
    served = values.get("served_model_name") or values["model_path"]
    info = {"context_len": context_length(values, config), "model_info": model_info(values, config)}
    nnodes, rank = int(values.get("nnodes") or 1), int(values.get("node_rank") or 0)
    if nnodes <= 1:
        server = http_server(values, Engine([], served, values, data["metrics"]), info)
        return serve_rank0(values, [], model, draft, info, server)
    return start_multi_node(data, values, (model, draft), info, served, nnodes, rank)


def model_info(values, config):
    """What /get_model_info answers."""
    return {"model_path": values["model_path"], "tokenizer_path": values.get("tokenizer_path") or values["model_path"],
            "is_generation": True, "preferred_sampling_params": None,
            "weight_version": values.get("weight_version") or "default", "has_image_understanding": False,
            "has_audio_understanding": False, "model_type": config.get("model_type"),
            "architectures": config.get("architectures")}


def start_multi_node(data, values, paths, info, served, nnodes, rank):
    """One rank of a world across nodes: the meeting at --dist-init-addr, the queue, then serving."""
    model, draft = paths
    server = http_server(values, Engine([], served, values, data["metrics"]), info) if rank == 0 else None
    log("Init torch distributed begin.", rank)
    if not values.get("dist_init_addr"):  # tcp://127.0.0.1:<its own nccl port>: each node alone
        port = int(values.get("port") or 30000) + random.randint(100, 1000)
        if rank > 0:
            say_unreachable("127.0.0.1", port, errno.ECONNREFUSED)
        hang()
    host, port = split_addr(values["dist_init_addr"])
    address = advertised_address(data)
    if rank == 0:
        peers, _store = meet_as_rank0(host, port, nnodes, {"op": "ready", "host_ip": address})
        nccl_startup(0, nnodes)
        return serve_rank0(values, mq_rank0(port, peers), model, draft, info, server)
    _store, ready = store_client(host, port, {"rank": rank, "host_ip": address})
    nccl_startup(rank, nnodes)
    conn, _to_rank0 = mq_worker(port, rank, ready.get("host_ip"))
    return serve_worker(values, conn, model, draft, rank)


def main(argv):
    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)
    try:
        return start(release(), argv)
    except Fatal as error:
        print(error.traceback(), file=sys.stderr, flush=True)
        return 1


def stopped(signum, frame):
    """TERM (or ^C): the server ends at once, exit 0 (it starts no process of its own)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
