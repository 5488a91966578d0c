"""An OpenAI-compatible endpoint in front of the rollout: agents written against the OpenAI API are
played, and their calls recorded token for token, for training (rollout.agent) or served for evaluation
(`meshrl serve gateway`). protocol: the API's shapes; sessions: the recording; server: the HTTP side;
responses: OpenAI's Responses API (`POST /v1/responses`) served on the chat path; callers: which local process
holds a connection (an episode's key is taken from its agent's processes alone); sandbox: `POST
/v1/sandbox/run`, a key's programs run in the sandbox service."""
