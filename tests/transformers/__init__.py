"""Hugging Face transformers (tiny, random weights) trained by onnxtrain against torch autograd."""
