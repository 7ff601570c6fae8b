"""The platform a CUDA build detects on a GPU node: it has sleep mode."""


class CudaPlatform:
    def is_sleep_mode_available(self) -> bool:
        return True


current_platform = CudaPlatform()
