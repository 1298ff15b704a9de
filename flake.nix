{
  description = "gptforge: a shell where pixi and the NVIDIA driver work (nix develop, nix run .#gptforge-shell)";

  # The pin itself is flake.lock; tests/nix/nixpkgs-pin.toml records where it was verified.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";

  outputs =
    { self, nixpkgs }:
    let
      system = "x86_64-linux";
      pkgs = nixpkgs.legacyPackages.${system};
      pixi = import ./nix/pixi.nix { inherit pkgs system; };

      # Where the host's driver files appear inside the sandbox when the host is not NixOS (NixOS
      # keeps them in /run/opengl-driver/lib, which the sandbox shows as it is).
      driverRoot = "/.host-driver";

      # No CUDA here: CUDA, cuDNN and nvcc come from the pixi environments, the driver from the host.
      shell = pkgs.buildFHSEnv {
        name = "gptforge-shell";
        targetPkgs = p: [
          pixi
          p.git
          p.cacert
          p.gcc
        ];
        runScript = "bash";
        # On the host, before bubblewrap starts: bind the driver's files, read-only, one by one.
        extraPreBwrapCmds = ''
          driver_files=$(${pkgs.runtimeShell} ${./nix/host-driver.sh} ${driverRoot}) || exit 2
          driver_binds=()
          while IFS=$'\t' read -r src dest; do
            if [[ -n $src ]]; then
              driver_binds+=(--ro-bind "$src" "$dest")
            fi
          done <<< "$driver_files"
        '';
        extraBwrapArgs = [ ''"''${driver_binds[@]}"'' ];
        # Only the driver on LD_LIBRARY_PATH: the sandbox's /usr/lib holds an older libstdc++ than the
        # pixi environments, and anything on LD_LIBRARY_PATH wins over their RUNPATH.
        profile = ''
          export LD_LIBRARY_PATH=/run/opengl-driver/lib:${driverRoot}/lib
          export PATH=${driverRoot}/bin:$PATH
          export SSL_CERT_FILE=''${SSL_CERT_FILE:-${pkgs.cacert}/etc/ssl/certs/ca-bundle.crt}
        '';
      };
    in
    {
      packages.${system} = {
        inherit pixi;
        gptforge-shell = shell;
        default = shell;
      };
      # Interactive: `nix develop` enters the sandbox. For scripts, `nix develop --command` does not
      # (the sandbox starts from the shell hook): use `nix run .#gptforge-shell -- -c '...'`.
      devShells.${system}.default = shell.env;
    };
}
