"""The example harness's agent program: one chat call, print the answer."""

import os
import sys

from openai import OpenAI


def main() -> None:
    client = OpenAI()  # reads OPENAI_BASE_URL and OPENAI_API_KEY
    reply = client.chat.completions.create(
        model=os.environ.get("EXAMPLE_MODEL", "policy"),
        messages=[{"role": "user", "content": sys.argv[1]}],
        max_tokens=int(sys.argv[2]) if len(sys.argv) > 2 else 64,
    )
    print(reply.choices[0].message.content or "")


if __name__ == "__main__":
    main()
