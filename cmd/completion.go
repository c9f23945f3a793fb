package cmd

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// The bash and zsh scripts ask leaderrun itself for candidates
// (--generate-bash-completion), as urfave/cli's own scripts do.
const bashCompletion = `# bash completion for leaderrun; source it, or install it as
# /usr/share/bash-completion/completions/leaderrun
_leaderrun_complete() {
  local cur words cword
  COMPREPLY=()
  cur="${COMP_WORDS[COMP_CWORD]}"
  words=("${COMP_WORDS[@]:0:$COMP_CWORD}")
  local opts
  if [[ "$cur" == "-"* ]]; then
    opts=$("${words[@]}" "$cur" --generate-bash-completion 2>/dev/null)
  else
    opts=$("${words[@]}" --generate-bash-completion 2>/dev/null)
  fi
  COMPREPLY=($(compgen -W "${opts}" -- "${cur}"))
}
complete -o bashdefault -o default -F _leaderrun_complete leaderrun
`

const zshCompletion = `#compdef leaderrun
# zsh completion for leaderrun; put it on $fpath as _leaderrun
_leaderrun() {
  local -a opts
  local cur=${words[-1]}
  if [[ "$cur" == "-"* ]]; then
    opts=("${(@f)$(${words[@]:0:#words[@]-1} ${cur} --generate-bash-completion)}")
  else
    opts=("${(@f)$(${words[@]:0:#words[@]-1} --generate-bash-completion)}")
  fi
  if [[ "${opts[1]}" != "" ]]; then
    _describe 'values' opts
  else
    _files
  fi
}
compdef _leaderrun leaderrun
`

func completionCommand(st *state) *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script for bash, zsh or fish",
		UsageText: "leaderrun completion bash|zsh|fish",
		Action: func(c *cli.Context) error {
			switch shell := c.Args().First(); shell {
			case "bash":
				fmt.Fprint(st.stdout, bashCompletion)
			case "zsh":
				fmt.Fprint(st.stdout, zshCompletion)
			case "fish":
				script, err := c.App.ToFishCompletion()
				if err != nil {
					return fmt.Errorf("fish completion: %w", err)
				}
				fmt.Fprint(st.stdout, script)
			default:
				return usageErrorf("completion %q: want bash, zsh or fish", shell)
			}
			return nil
		},
	}
}
