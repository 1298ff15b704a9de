{
  description = "A stand-in for nixpkgs: only what gptforge's flake.nix calls, evaluated and never built";

  outputs =
    { self }:
    {
      legacyPackages.x86_64-linux = import ./pkgs.nix { system = "x86_64-linux"; };
    };
}
