"""A stand-in for a serving engine's HTTP side, in vLLM's or SGLang's shape, for the acceptance
probe: `/health`, and per engine what rca reads of it. Each prompt served "accepts" a fixed share:
16 drafts of 3 tokens, 30 tokens accepted, 15/10/5 by position.

  vllm:   /v1/models, /v1/completions, /metrics (Prometheus counters, `_total`, an engine label)
  sglang: /server_info, /generate (meta_info per request; --old: only spec_verify_ct, as 0.4)

--mode no-spec exports no speculative counters; --mode frozen never moves them. With --draft DIR
--good-ids A B C, it serves the draft as an engine would: 45 of the 48 draft tokens accepted when
DIR/config.json's eagle_config ids are those, 6 when they are not.

    python spec_server.py --engine vllm --port 8123 [--mode normal|no-spec|frozen] [--old]
                          [--draft DIR --good-ids 2 30 58]
"""

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import os

DRAFTS, PROPOSED, ACCEPTED, BY_POSITION = 16, 48, 30, (15, 10, 5)


def acceptance_of(draft, good_ids):
    """Accepted draft tokens and acceptance by position per prompt, for the draft served."""
    if draft is None:
        return ACCEPTED, BY_POSITION
    with open(os.path.join(draft, "config.json")) as handle:
        ids = json.load(handle).get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids")
    return (45, (16, 15, 14)) if ids == good_ids else (6, (4, 2, 0))


class State:
    def __init__(self, mode: str, accepted=ACCEPTED, by_position=BY_POSITION) -> None:
        self.mode = mode
        self.served = 0
        self.accepted, self.by_position = accepted, by_position
        self.lock = threading.Lock()

    def metrics(self) -> str:
        if self.mode == "no-spec":
            return "# HELP vllm:num_requests_running Running.\nvllm:num_requests_running{model_name=\"lab\"} 0.0\n"
        served = 0 if self.mode == "frozen" else self.served
        labels = 'engine="0",model_name="lab"'
        lines = [
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            f"vllm:spec_decode_num_drafts_total{{{labels}}} {float(DRAFTS * served)}",
            f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {float(PROPOSED * served)}",
            f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {float(self.accepted * served)}",
            f"vllm:spec_decode_num_drafts_created{{{labels}}} 1.7e9",
        ]
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{j}"}} {float(n * served)}'
            for j, n in enumerate(self.by_position)
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

        def do_GET(self) -> None:
            if self.path == "/health":
                self.answer("")
            elif engine == "vllm" and self.path == "/metrics":
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
    args = parser.parse_args()
    state = State(args.mode, *acceptance_of(args.draft, args.good_ids))
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(state, args.engine, args.old))
    server.serve_forever()


if __name__ == "__main__":
    main()
