"""The built-in scenario names, for ``chainrun lab serve --help`` without building the
scenario models (:data:`chainrun.lab.scenarios.BUILTIN_SCENARIOS`, whose keys these are:
kept equal by a test)."""

BUILTIN_SCENARIO_NAMES = ("fast", "lognormal", "heavy-tail", "bimodal-guard", "work-noise")

#: the server families the lab can send as (``--server``; chainrun.lab.servers.SERVER_PROFILES)
SERVER_FAMILY_NAMES = ("openai", "azure", "llama.cpp", "vllm", "ollama", "lmstudio", "deepseek",
                       "gemini", "mistral", "minimax")  # fmt: skip
