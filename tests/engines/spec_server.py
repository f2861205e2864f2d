"""A stand-in for a serving engine's HTTP side, in vLLM's or SGLang's shape, for the acceptance
probe: `/health`, and per engine what rca reads of it. Each prompt served "accepts" a fixed share:
16 drafts of 3 tokens, 30 tokens accepted, 15/10/5 by position.

  vllm:   /v1/models, /v1/completions, /metrics (Prometheus counters, `_total`, an engine label)
  sglang: /server_info, /generate (meta_info per request; --old: only spec_verify_ct, as 0.4)

--mode no-spec exports no speculative counters; --mode frozen never moves them; --hostile KIND
answers as no engine would (see HOSTILE), for rca to refuse in one line. With --draft DIR
--good-ids A B C, it serves the draft as an engine would: 45 of the 48 draft tokens accepted when
DIR/config.json's eagle_config ids are those, 6 when they are not.

    python spec_server.py --engine vllm --port 8123 [--mode normal|no-spec|frozen] [--old]
                          [--draft DIR --good-ids 2 30 58]
"""

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DRAFTS, PROPOSED, ACCEPTED, BY_POSITION = 16, 48, 30, (15, 10, 5)
HOSTILE = (
    "nan",  # a counter of NaN
    "inf",  # a counter of +Inf
    "position-label",  # a per-position counter whose position is not a number
    "error-second-metrics",  # HTTP 500 from the second /metrics read on
    "cut",  # a completion shorter than its Content-Length
    "not-json",  # a completion that is an HTML page
    "string-counts",  # SGLang counts as strings
    "impossible",  # more tokens accepted than drafted
    "negative-histogram",  # an SGLang histogram bucket below zero
    "wide-histogram",  # an SGLang histogram of 300,000 buckets
    "decreasing",  # counters that go down between reads
    "trickle",  # /metrics a byte at a time, never ending
    "huge",  # /metrics without end
    "redirect",  # completions redirected to another host
)


def acceptance_of(draft, good_ids):
    """Accepted draft tokens and acceptance by position per prompt, for the draft served."""
    if draft is None:
        return ACCEPTED, BY_POSITION
    with open(os.path.join(draft, "config.json")) as handle:
        ids = json.load(handle).get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids")
    return (45, (16, 15, 14)) if ids == good_ids else (6, (4, 2, 0))


class State:
    def __init__(self, mode: str, accepted=ACCEPTED, by_position=BY_POSITION, hostile=None) -> None:
        self.mode = mode
        self.hostile = hostile
        self.metrics_read = 0
        self.served = 0
        self.accepted, self.by_position = accepted, by_position
        self.lock = threading.Lock()

    def metrics(self) -> str:
        if self.mode == "no-spec":
            return '# HELP vllm:num_requests_running Running.\nvllm:num_requests_running{model_name="lab"} 0.0\n'
        served = 0 if self.mode == "frozen" else self.served
        if self.hostile == "decreasing":
            served = 100 - served
        accepted = PROPOSED * 2 if self.hostile == "impossible" else self.accepted
        labels = 'engine="0",model_name="lab"'
        drafts = {"nan": "NaN", "inf": "+Inf"}.get(self.hostile, float(DRAFTS * served))
        lines = [
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}",
            f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {float(PROPOSED * served)}",
            f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {float(accepted * served)}",
            f"vllm:spec_decode_num_drafts_created{{{labels}}} 1.7e9",
        ]
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{label}"}} {float(n * served)}'
            for j, n in enumerate(self.by_position)
            for label in ["x" if self.hostile == "position-label" else j]
        ]
        return "\n".join(lines) + "\n"


def handler(state: State, engine: str, old: bool):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def answer(self, body, status: int = 200, kind: str = "application/json") -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def endless(self, pause: float, piece: bytes) -> None:
            """An answer that never ends (no Content-Length: it runs until the connection closes)."""
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(piece)
                    self.wfile.flush()
                    time.sleep(pause)
            except OSError:
                return

        def do_GET(self) -> None:
            if self.path == "/health":
                self.answer("")
            elif engine == "vllm" and self.path == "/metrics":
                with state.lock:
                    state.metrics_read += 1
                if state.hostile == "trickle":
                    self.endless(0.2, b"#")
                elif state.hostile == "huge":
                    self.endless(0, b"# vllm:padding " + b"x" * 65000 + b"\n")
                elif state.hostile == "error-second-metrics" and state.metrics_read > 1:
                    self.answer("Internal Server Error", 500, kind="text/plain")
                else:
                    self.answer(state.metrics(), kind="text/plain")
            elif engine == "vllm" and self.path == "/v1/models":
                self.answer({"data": [{"id": "lab"}]})
            elif engine == "sglang" and self.path == "/server_info":
                self.answer({"speculative_num_steps": 3, "version": "0.5.12"})
            else:
                self.answer({"detail": "Not Found"}, 404)

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                state.served += 1
            if engine == "vllm" and self.path == "/v1/completions":
                if state.hostile == "cut":
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(b'{"choices": [')
                    self.close_connection = True
                elif state.hostile == "not-json":
                    self.answer("<html>Bad Gateway</html>", kind="text/html")
                elif state.hostile == "redirect":
                    self.send_response(302)
                    self.send_header("Location", "http://elsewhere.invalid/v1/completions")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self.answer({"choices": [{"text": "x"}], "usage": {"completion_tokens": request["max_tokens"]}})
            elif engine == "sglang" and self.path == "/generate":
                tokens = request["sampling_params"]["max_new_tokens"]
                meta = {"completion_tokens": tokens}
                if state.mode != "no-spec":
                    meta["spec_verify_ct"] = DRAFTS
                    if not old:
                        meta.update(
                            spec_num_correct_drafts=ACCEPTED,
                            spec_num_proposed_drafts=PROPOSED,
                            spec_correct_drafts_histogram=[1, 5, 5, 5],  # verify steps with 0, 1, 2, 3 correct
                        )
                    if state.hostile == "string-counts":
                        meta.update(spec_verify_ct=str(DRAFTS), spec_num_correct_drafts="thirty")
                    elif state.hostile == "negative-histogram":
                        meta["spec_correct_drafts_histogram"] = [1, 5, -5, 5]
                    elif state.hostile == "wide-histogram":
                        meta["spec_correct_drafts_histogram"] = [1] * 300_000
                    elif state.hostile == "impossible":
                        meta["spec_num_correct_drafts"] = PROPOSED * 2
                self.answer({"text": "x", "meta_info": meta})
            else:
                self.answer({"detail": "Not Found"}, 404)

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=["vllm", "sglang"], default="vllm")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=["normal", "no-spec", "frozen"], default="normal")
    parser.add_argument("--old", action="store_true")
    parser.add_argument("--draft")
    parser.add_argument("--good-ids", type=int, nargs="+")
    parser.add_argument("--hostile", choices=HOSTILE)
    args = parser.parse_args()
    state = State(args.mode, *acceptance_of(args.draft, args.good_ids), hostile=args.hostile)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(state, args.engine, args.old))
    server.serve_forever()


if __name__ == "__main__":
    main()
