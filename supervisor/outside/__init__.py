"""The outside view: PyTorch jobs that ddptop did not launch, seen only through what the operating system shows."""
