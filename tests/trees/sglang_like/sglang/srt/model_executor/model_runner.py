"""A model runner in the shape of sglang/srt/model_executor/model_runner.py (0.5.x)."""

import logging

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, model_config, server_args, is_draft_worker=False):
        self.model_config = model_config
        self.server_args = server_args
        self.is_draft_worker = is_draft_worker
        self.spec_algorithm = server_args.speculative_algorithm
        self.eagle_use_aux_hidden_state = False
        if self.spec_algorithm.is_eagle3() and not self.is_draft_worker:
            draft_model_config = self._build_model_config(
                server_args,
                model_path=server_args.speculative_draft_model_path,
                is_draft_model=True,
            )
            self.eagle_use_aux_hidden_state = True
            try:
                # get the aux layer from draft model config
                eagle_config = getattr(draft_model_config.hf_config, "eagle_config", None)
                self.eagle_use_aux_hidden_state = eagle_config.get("use_aux_hidden_state", True)
                self.eagle_aux_hidden_state_layer_ids = eagle_config[
                    "eagle_aux_hidden_state_layer_ids"
                ]
            except:
                # if there is no aux layer, set to None
                self.eagle_aux_hidden_state_layer_ids = None
        self.model = None

    def _build_model_config(self, server_args, model_path, is_draft_model=False):
        return ModelConfig.from_server_args(server_args, model_path=model_path)

    def load_model(self):
        self.model = get_model(model_config=self.model_config)

    def init_aux_hidden_state_capture(self):
        """Must be called before CUDA graph capture."""
        if self.eagle_use_aux_hidden_state:
            self.model.set_eagle3_layers_to_capture(
                self.eagle_aux_hidden_state_layer_ids
            )
