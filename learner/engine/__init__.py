"""The model on its device: the DeepSpeed engine (the only module that imports DeepSpeed), the
learner's collectives (the only one that calls torch.distributed), LoRA adapters, checkpoint
manifests and the Hugging Face export, and the RNG states a checkpoint keeps."""
