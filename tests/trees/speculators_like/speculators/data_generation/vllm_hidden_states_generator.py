"""A data generator in the shape of speculators 0.4.0 data_generation/vllm_hidden_states_generator.py."""

from transformers import AutoConfig


class VllmHiddenStatesGenerator:
    def __init__(self, model_path, layer_ids=None, max_model_len=2048, tensor_parallel_size=1):
        self.model_path = model_path
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
        if hasattr(config, "num_hidden_layers"):
            num_layers = config.num_hidden_layers
        elif hasattr(config, "text_config"):
            num_layers = config.text_config.num_hidden_layers
        else:
            raise ValueError("Cannot determine num_layers from config")

        if layer_ids is None:
            self.layer_ids = [2, num_layers // 2, num_layers - 3, num_layers - 1]
        else:
            self.layer_ids = layer_ids

        for layer_id in self.layer_ids:
            if layer_id < 0 or layer_id >= num_layers:
                raise ValueError(f"Layer index {layer_id} out of bounds")

        self.executor = MultiprocExecutor(vllm_config=self._create_vllm_config())
        self._setup_capture()

    def _setup_capture(self):
        self.executor.collective_rpc(
            "_setup_hidden_states_capture",
            args=(self.layer_ids,),
        )
